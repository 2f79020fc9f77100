"""The Copilot SDK's wire protocol, for both ends: LSP-style framing (`framing`), JSON-RPC 2.0
connections (`jsonrpc`) and one model per method's params and result (`wire`).

`trimtab.server` serves it and `trimtab.remote` speaks it as a client; importing this package
loads neither.
"""

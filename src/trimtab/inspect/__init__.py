"""The session inspector (`trimtab inspect`): a read-only web page over a session store.

It shows the sessions, each session's runs, model calls, tool calls and context operations,
the window the model saw at each call (rebuilt from the log), token usage, and follows a
running session live. It reads the log through the public `Store` protocol only, and needs the
`inspect` extra (Starlette, uvicorn, Jinja2).

```python
from trimtab.inspect import create_app, serve

app = create_app(store, token=token)                     # any ASGI server can run it
await serve("postgresql://db/trimtab", port=8080)        # or let trimtab run it on uvicorn
```
"""

from trimtab.inspect.app import create_app
from trimtab.inspect.serve import InspectError, inspector_url, serve

__all__ = ["InspectError", "create_app", "inspector_url", "serve"]

# shellcheck shell=bash
# Start a throwaway PostgreSQL cluster for the store tests (docs: scale-out.md 4.9).
#
# Source it from a script (.ci/run does): it exports
#   TRIMTAB_TEST_PG_DSN   postgresql://postgres@127.0.0.1:PORT/postgres (a free port)
#   TRIMTAB_TEST_PG_CTL   the pg_ctl binary      } for tests that restart the server;
#   TRIMTAB_TEST_PG_DATA  the cluster directory  } the cluster belongs to the OS user
#   TRIMTAB_TEST_PG_LOG   the server log file    } `postgres`
# and registers an EXIT trap that stops the server and deletes the cluster. Like any sourced
# file it also leaves `set -euo pipefail` on in the caller. It needs root: it installs the
# package with apt when missing, and runs the server as `postgres` (initdb refuses root).
set -euo pipefail

if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
PGTMP=$(mktemp -d /tmp/pgci.XXXXXX)
chown postgres:postgres "$PGTMP"
trap 'su postgres -c "$PGBIN/pg_ctl -D $PGTMP/data -m immediate stop" >/dev/null 2>&1 || true; rm -rf "$PGTMP"' EXIT

su postgres -c "$PGBIN/initdb -D $PGTMP/data -U postgres --auth=trust -E UTF8" >/dev/null
# A free port rather than a fixed one: another cluster (a developer's, a second run) may
# already listen on this machine.
PGPORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# fsync and friends off: commits are fsync-bound (~270/s on CI disks) and the cluster is
# thrown away; crash durability is PostgreSQL's job, not what these tests check.
su postgres -c "$PGBIN/pg_ctl -D $PGTMP/data -l $PGTMP/server.log -w -t 60 \
  -o '-c listen_addresses=127.0.0.1 -p $PGPORT -k $PGTMP -c fsync=off \
      -c synchronous_commit=off -c full_page_writes=off' start" >/dev/null

export TRIMTAB_TEST_PG_DSN="postgresql://postgres@127.0.0.1:$PGPORT/postgres"
export TRIMTAB_TEST_PG_CTL="$PGBIN/pg_ctl"
export TRIMTAB_TEST_PG_DATA="$PGTMP/data"
export TRIMTAB_TEST_PG_LOG="$PGTMP/server.log"

"""Check that a database server in a DATABASE_URL accepts a connection.

Usage: python scripts/db_ping.py [--quiet] [--tcp] URL

Exits 0 if a connection (with the URL's user, password and database) succeeds within a few
seconds, 1 if not, printing the reason to stderr. Uses the installed drivers (psycopg,
mysqlclient) and django-environ to read the URL, so run it with the project's venv.
With ``--tcp`` it only checks that the server's port accepts a TCP connection, with the
standard library alone (any python3, before a venv exists).
The URL is printed with its password masked.
"""

from __future__ import annotations

import re
import sys

CONNECT_TIMEOUT = 5


def redact(url: str) -> str:
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", url)


def ping(url: str) -> None:
    import environ

    config = environ.Env.db_url_config(url)
    engine = config["ENGINE"].rsplit(".", 1)[-1]
    host = config.get("HOST") or None
    port = int(config["PORT"]) if config.get("PORT") else None
    if engine == "postgresql":
        import psycopg

        with psycopg.connect(
            host=host,
            port=port,
            user=config.get("USER") or None,
            password=config.get("PASSWORD") or None,
            dbname=config.get("NAME") or None,
            connect_timeout=CONNECT_TIMEOUT,
        ) as conn:
            conn.execute("SELECT 1")
    elif engine == "mysql":
        import MySQLdb

        kwargs = {
            "host": host or "localhost",
            "user": config.get("USER") or "",
            "passwd": config.get("PASSWORD") or "",
            "connect_timeout": CONNECT_TIMEOUT,
        }
        if port:
            kwargs["port"] = port
        if config.get("NAME"):
            kwargs["db"] = config["NAME"]
        conn = MySQLdb.connect(**kwargs)
        try:
            conn.cursor().execute("SELECT 1")
        finally:
            conn.close()
    elif engine == "sqlite3":
        return
    else:
        raise ValueError(f"don't know how to ping a {engine!r} database")


DEFAULT_PORTS = {"postgres": 5432, "postgresql": 5432, "pgsql": 5432, "psql": 5432, "mysql": 3306}


def tcp_ping(url: str) -> None:
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme.startswith("sqlite"):
        return
    port = parts.port or DEFAULT_PORTS.get(parts.scheme.split("+")[0])
    if port is None:
        raise ValueError(f"no port in the URL and none known for {parts.scheme!r}")
    with socket.create_connection((parts.hostname or "localhost", port), CONNECT_TIMEOUT):
        pass


def main(argv: list[str]) -> int:
    args = [a for a in argv if a not in ("--quiet", "--tcp")]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    url = args[0]
    try:
        if "--tcp" in argv:
            tcp_ping(url)
        else:
            ping(url)
    except Exception as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"db_ping: cannot connect to {redact(url)}: {message}", file=sys.stderr)
        return 1
    if "--quiet" not in argv:
        how = " (its port accepts TCP connections)" if "--tcp" in argv else ""
        print(f"db_ping: {redact(url)} is reachable{how}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

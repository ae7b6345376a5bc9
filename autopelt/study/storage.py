"""Where studies live: an SQLAlchemy URL, checked without writing, then opened as Optuna RDB storage.

SQLite (`sqlite:///autopelt.db`, the default) serves one machine; PostgreSQL (`postgresql://user@host/db`)
lets search processes on several machines share a study.
"""

from __future__ import annotations

import random
import time
import warnings
from pathlib import Path

from autopelt.errors import UserError
from autopelt.search.recovery import GRACE_SECONDS, HEARTBEAT_SECONDS

DEFAULT_STORAGE = "sqlite:///autopelt.db"
_EXAMPLES = "e.g. sqlite:///autopelt.db or postgresql://user:password@host:5432/db"
_SQLITE_MAGIC = b"SQLite format 3\x00"


def normalise_url(url: str) -> str:
    """`postgresql://` means psycopg (3) to SQLAlchemy 2.1; use psycopg2 when only that is installed
    (autopelt's `postgres` extra installs psycopg2-binary)."""
    import importlib.util

    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None \
            and importlib.util.find_spec("psycopg2") is not None:
        return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def check_storage(url: str) -> None:
    """Raise UserError unless `url` names a database the search can use. Never creates or writes anything."""
    import sqlalchemy

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except Exception:
        raise UserError(f"--storage {url!r} is not a database URL ({_EXAMPLES})") from None
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite(parsed.database)
    else:
        _check_server(parsed)


def _check_sqlite(database: str | None) -> None:
    if not database or database == ":memory:":
        raise UserError("--storage: an in-memory SQLite database cannot be resumed; give a file, sqlite:///autopelt.db")
    path = Path(database).expanduser()
    if not path.parent.is_dir():
        raise UserError(f"--storage: folder {path.parent} does not exist")
    if path.exists():
        with path.open("rb") as handle:
            head = handle.read(len(_SQLITE_MAGIC))
        if head and head != _SQLITE_MAGIC:
            raise UserError(f"--storage: {path} is not an SQLite database")


def _check_server(parsed) -> None:
    import sqlalchemy

    shown = parsed.render_as_string(hide_password=True)
    engine = checked_engine(parsed, _connect_timeout(parsed))
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT 1"))
    except Exception as error:
        raise UserError(f"cannot reach database {shown}: {first_line(getattr(error, 'orig', error))}") from None
    finally:
        engine.dispose()


def checked_engine(parsed, connect_args: dict):
    """A throwaway engine (no pool) for a parsed URL; a missing driver or a bad URL is a one-line UserError."""
    import sqlalchemy

    shown = parsed.render_as_string(hide_password=True)
    try:
        return sqlalchemy.create_engine(parsed, connect_args=connect_args, poolclass=sqlalchemy.NullPool)
    except ImportError as error:
        raise UserError(f"--storage {shown}: the database driver is missing ({error}); "
                        "for PostgreSQL: pip install 'autopelt[postgres]'") from None
    except Exception as error:
        raise UserError(f"--storage {shown}: {first_line(error)}") from None


def _connect_timeout(parsed) -> dict:
    return {"connect_timeout": 10} if parsed.get_backend_name() in ("postgresql", "mysql") else {}


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def sqlite_path(url: str) -> Path | None:
    """The database file of an SQLite URL, else None."""
    import sqlalchemy

    parsed = sqlalchemy.engine.make_url(url)
    return Path(parsed.database).expanduser() if parsed.get_backend_name() == "sqlite" else None


def open_storage(url: str, write_ahead_log: bool = True):
    """Optuna RDB storage with heartbeats on (the controller records them; see recovery.py)."""
    sqlite = sqlite_path(url) is not None
    # SQLite: several controllers on one machine wait for the write lock instead of failing at once
    engine_kwargs = {"connect_args": {"timeout": 60}} if sqlite else {"pool_pre_ping": True}
    storage = _rdb_storage(url, engine_kwargs)
    if sqlite and write_ahead_log:
        _write_ahead_log(storage.engine)
    return storage


def _rdb_storage(url: str, engine_kwargs: dict, attempts: int = 4):
    """Optuna creates its tables on first use; processes starting together on a new database race to do
    it and the losers fail ("table ... already exists"). A moment later the tables are there: try again."""
    import optuna
    import sqlalchemy

    for attempt in range(1, attempts + 1):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_SECONDS,
                    grace_period=GRACE_SECONDS,
                )
        except sqlalchemy.exc.DatabaseError:
            if attempt == attempts:
                raise
            time.sleep(0.5 * attempt + random.random())


def _write_ahead_log(engine) -> None:
    """SQLite in WAL mode with synchronous=NORMAL: a commit costs ~0.1 ms instead of an fsync (~15 ms here),
    readers never block the writer, and a crash still never corrupts the file (it may lose the last commits).
    A controller commits ~40 times per trial (Optuna writes each user attribute in its own transaction)."""
    import sqlalchemy

    def on_connect(connection, _record) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    sqlalchemy.event.listen(engine, "connect", on_connect)
    engine.dispose()  # connections opened while Optuna created its tables predate the listener


def hide_password(url: str) -> str:
    import sqlalchemy

    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url

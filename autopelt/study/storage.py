"""Where studies live: an SQLAlchemy URL, checked without writing, then opened as Optuna RDB storage.

SQLite (`sqlite:///autopelt.db`, the default) serves one machine; PostgreSQL (`postgresql://user@host/db`)
lets search processes on several machines share a study.

A search opens its storage for writing (`check_storage`, then `open_storage`, which creates Optuna's tables).
Everything else only reads (`open_existing`): a missing SQLite file, a file that is not SQLite, a database
without Optuna's tables, or a server that does not answer are each a one-line UserError, and nothing is created.
"""

from __future__ import annotations

import random
import time
import warnings
from pathlib import Path

from autopelt.errors import UserError

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


def hide_password(url: str) -> str:
    """The URL without its password, for messages."""
    import sqlalchemy

    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def sqlite_path(url: str) -> Path | None:
    """The database file of an SQLite URL, else None."""
    import sqlalchemy

    parsed = sqlalchemy.engine.make_url(url)
    return Path(parsed.database).expanduser() if parsed.get_backend_name() == "sqlite" else None


# -- checks that write nothing ------------------------------------------------------------------------------


def check_storage(url: str) -> None:
    """Raise UserError unless `url` names a database a search can write to. Never creates or writes anything."""
    parsed = _parse(url)
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite(parsed.database, must_exist=False)
    else:
        _check_tables(parsed, _connect_args(parsed), need_optuna=False)


def _parse(url: str):
    import sqlalchemy

    try:
        return sqlalchemy.engine.make_url(url)
    except Exception:
        raise UserError(f"--storage {url!r} is not a database URL ({_EXAMPLES})") from None


def _check_sqlite(database: str | None, must_exist: bool) -> None:
    if not database or database == ":memory:":
        if must_exist:
            raise UserError("--storage: give the SQLite file the search wrote, e.g. sqlite:///autopelt.db")
        raise UserError("--storage: an in-memory SQLite database cannot be resumed; give a file, sqlite:///autopelt.db")
    path = Path(database).expanduser()
    if must_exist and not path.is_file():
        raise UserError(f"--storage: no database file {path} (run `autopelt search` first, or give --storage)")
    if not must_exist and not path.parent.is_dir():
        raise UserError(f"--storage: folder {path.parent} does not exist")
    if path.exists():
        with path.open("rb") as handle:
            head = handle.read(len(_SQLITE_MAGIC))
        if (head or must_exist) and head != _SQLITE_MAGIC:
            raise UserError(f"--storage: {path} is not an SQLite database")


def _check_tables(parsed, connect_args: dict, need_optuna: bool) -> None:
    """Connect once (a server that does not answer is a UserError); with `need_optuna`, Optuna's tables must
    be there."""
    import sqlalchemy

    where = parsed.render_as_string(hide_password=True)
    engine = _throwaway_engine(parsed, connect_args)
    try:
        with engine.connect() as connection:
            tables = set(sqlalchemy.inspect(connection).get_table_names()) if need_optuna else set()
    except Exception as error:
        raise UserError(f"cannot reach database {where}: {first_line(getattr(error, 'orig', error))}") from None
    finally:
        engine.dispose()
    if need_optuna and not {"studies", "trials", "version_info"} <= tables:
        raise UserError(f"--storage {where} holds no Optuna studies (no `autopelt search` wrote to it)")


def _throwaway_engine(parsed, connect_args: dict):
    """An engine without a pool for a parsed URL; a missing driver or a bad URL is a one-line UserError."""
    import sqlalchemy

    shown = parsed.render_as_string(hide_password=True)
    try:
        return sqlalchemy.create_engine(parsed, connect_args=connect_args, poolclass=sqlalchemy.NullPool)
    except ImportError as error:
        raise UserError(f"--storage {shown}: the database driver is missing ({error}); "
                        "for PostgreSQL: pip install 'autopelt[postgres]'") from None
    except Exception as error:
        raise UserError(f"--storage {shown}: {first_line(error)}") from None


def _connect_args(parsed) -> dict:
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return {"timeout": 60}  # several processes on one machine wait for the write lock instead of failing
    if backend in ("postgresql", "mysql"):
        return {"connect_timeout": 10}
    return {}


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# -- opening ---------------------------------------------------------------------------------------------------


def open_storage(url: str, heartbeat_seconds: int | None = None, grace_seconds: int | None = None,
                 write_ahead_log: bool = True):
    """Optuna RDB storage for a search (creates Optuna's tables); heartbeats as the search's recovery asks."""
    sqlite = sqlite_path(url) is not None
    engine_kwargs = {"connect_args": {"timeout": 60}} if sqlite else {"pool_pre_ping": True}
    storage = _rdb_storage(url, engine_kwargs, {"heartbeat_interval": heartbeat_seconds,
                                                "grace_period": grace_seconds})
    if sqlite and write_ahead_log:
        _write_ahead_log(storage.engine)
    return storage


def open_existing(url: str):
    """Optuna RDB storage over a database that already holds Optuna's tables; UserError otherwise."""
    parsed = _parse(url)
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite(parsed.database, must_exist=True)
    connect_args = _connect_args(parsed)
    _check_tables(parsed, connect_args, need_optuna=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _rdb_storage(url, {"connect_args": connect_args}, {"skip_table_creation": True}, attempts=1)
    except Exception as error:  # e.g. tables written by a newer Optuna
        raise UserError(f"cannot open the studies in {hide_password(url)}: {first_line(error)}") from None


def load_study(storage, name: str, url: str):
    """The study called `name`; UserError listing the studies there when there is none."""
    import optuna

    names = sorted(optuna.get_all_study_names(storage))
    if name not in names:
        there = f"studies there: {', '.join(names)}" if names else "it holds no studies"
        raise UserError(f"no study {name!r} in {hide_password(url)}; {there}")
    return optuna.load_study(study_name=name, storage=storage)


def _rdb_storage(url: str, engine_kwargs: dict, options: dict, attempts: int = 4):
    """Optuna creates its tables on first use; processes starting together on a new database race to do
    it and the losers fail ("table ... already exists"). A moment later the tables are there: try again."""
    import optuna
    import sqlalchemy

    for attempt in range(1, attempts + 1):
        try:
            with warnings.catch_warnings():  # heartbeats are experimental in Optuna
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **options)
        except sqlalchemy.exc.DatabaseError:
            if attempt == attempts:
                raise
            time.sleep(0.5 * attempt + random.random())


def _write_ahead_log(engine) -> None:
    """SQLite in WAL mode with synchronous=NORMAL: a commit needs no fsync, readers never block the writer, and a
    crash still never corrupts the file (it may lose the last commits). A controller commits dozens of times per
    trial (Optuna writes each user attribute in its own transaction)."""
    import sqlalchemy

    def on_connect(connection, _record) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    sqlalchemy.event.listen(engine, "connect", on_connect)
    engine.dispose()  # connections opened while Optuna created its tables predate the listener

"""Opening an existing study database for reading (report, dashboard), with one-line errors.

Unlike a search, reading never creates anything: a missing SQLite file, a file that is not SQLite, a
database without Optuna's tables, or a server that does not answer are each a UserError, and Optuna's
storage (which creates its tables when they are missing) is only opened once the tables are known to exist.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from autopelt.errors import UserError
from autopelt.study.storage import checked_engine, first_line

DEFAULT_STORAGE = "sqlite:///autopelt.db"
_SQLITE_MAGIC = b"SQLite format 3\x00"
_EXAMPLES = "e.g. sqlite:///autopelt.db or postgresql://user:password@host:5432/db"


def shown(url: str) -> str:
    """The URL without its password, for messages."""
    import sqlalchemy

    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def open_existing(url: str):
    """Optuna RDB storage over a database that already holds Optuna's tables; UserError otherwise."""
    import optuna
    import sqlalchemy

    try:
        parsed = sqlalchemy.engine.make_url(url)
    except Exception:
        raise UserError(f"--storage {url!r} is not a database URL ({_EXAMPLES})") from None
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite:
        _check_sqlite_file(parsed.database)
    engine_kwargs = {"connect_args": _connect_args(parsed)}
    _check_tables(parsed, engine_kwargs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, skip_table_creation=True)
    except Exception as error:  # e.g. tables written by a newer Optuna
        raise UserError(f"cannot open the studies in {shown(url)}: {first_line(error)}") from None


def _check_sqlite_file(database: str | None) -> None:
    if not database or database == ":memory:":
        raise UserError("--storage: give the SQLite file the search wrote, e.g. sqlite:///autopelt.db")
    path = Path(database).expanduser()
    if not path.is_file():
        raise UserError(f"--storage: no database file {path} (run `autopelt search` first, or give --storage)")
    with path.open("rb") as handle:
        if handle.read(len(_SQLITE_MAGIC)) != _SQLITE_MAGIC:
            raise UserError(f"--storage: {path} is not an SQLite database")


def _check_tables(parsed, engine_kwargs: dict) -> None:
    import sqlalchemy

    where = parsed.render_as_string(hide_password=True)
    engine = checked_engine(parsed, engine_kwargs["connect_args"])
    try:
        with engine.connect() as connection:
            tables = set(sqlalchemy.inspect(connection).get_table_names())
    except Exception as error:
        raise UserError(f"cannot reach database {where}: {first_line(getattr(error, 'orig', error))}") from None
    finally:
        engine.dispose()
    if not {"studies", "trials", "version_info"} <= tables:
        raise UserError(f"--storage {where} holds no Optuna studies (no `autopelt search` wrote to it)")


def _connect_args(parsed) -> dict:
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return {"timeout": 60}  # a running search may hold the write lock for a moment
    if backend in ("postgresql", "mysql"):
        return {"connect_timeout": 10}
    return {}


def load_study(storage, name: str, url: str):
    """The study called `name`; UserError listing the studies there when there is none."""
    import optuna

    names = sorted(optuna.get_all_study_names(storage))
    if name not in names:
        there = f"studies there: {', '.join(names)}" if names else "it holds no studies"
        raise UserError(f"no study {name!r} in {shown(url)}; {there}")
    return optuna.load_study(study_name=name, storage=storage)

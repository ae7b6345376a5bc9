"""The one error type a user sees: a one-line message that says what to do."""


class UserError(Exception):
    """Bad input from the user. The CLI prints `autopelt: error: <message>` and exits with code 2."""

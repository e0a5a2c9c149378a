"""Errors a user can cause and fix; the CLI prints them as one line and exits non-zero."""


class UserError(Exception):
    """A problem the user can fix; the message says how."""


class DatabaseUnavailable(UserError):
    """The configured database cannot be reached."""


class InvalidArgument(UserError):
    """A bad value for one named option (the HTTP API answers 422 naming `name` as the field)."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name

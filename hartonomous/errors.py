"""Errors a user can cause and fix; the CLI prints them as one line and exits non-zero."""


class UserError(Exception):
    """A problem the user can fix; the message says how."""


class DatabaseUnavailable(UserError):
    """The configured database cannot be reached."""

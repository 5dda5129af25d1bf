"""The one domain exception. The API turns it into the error envelope; the dashboard into a message."""

from typing import Any


class ApplicationError(Exception):
    status = 400
    code = "invalid"

    def __init__(
        self, message: str, *, code: str | None = None, detail: Any = None, status: int | None = None
    ):
        super().__init__(message)
        self.message = message
        self.detail = detail
        if code:
            self.code = code
        if status:
            self.status = status


class ValidationFailed(ApplicationError):
    status, code = 400, "invalid"


class NotFound(ApplicationError):
    status, code = 404, "not_found"


class Forbidden(ApplicationError):
    status, code = 403, "forbidden"


class Conflict(ApplicationError):
    status, code = 409, "conflict"


class InvalidTransition(Conflict):
    code = "invalid_transition"


class PreconditionFailed(ApplicationError):
    status, code = 412, "precondition_failed"


class Unprocessable(ApplicationError):
    status, code = 422, "unprocessable"

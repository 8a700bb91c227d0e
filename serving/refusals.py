"""The refusals every endpoint sends: `APIError` and OpenAI's error body
`{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

ErrorType = Literal["invalid_request_error", "server_error"]


class ErrorDetail(BaseModel):
    message: str
    type: ErrorType
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """{"error": {"message", "type", "param", "code"}}, as the OpenAI API answers errors."""

    error: ErrorDetail

    @classmethod
    def of(cls, message: str, type: ErrorType, param: str | None = None,
           code: str | None = None) -> ErrorResponse:
        return cls(error=ErrorDetail(message=message, type=type, param=param, code=code))


def error_body(message: str, type: ErrorType, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """{"error": {"message", "type", "param", "code"}}, as the OpenAI API answers errors."""
    return ErrorResponse.of(message, type, param, code).model_dump(mode="json")


class APIError(Exception):
    """A request the server refuses, sent as an OpenAI-style error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: ErrorType = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

"""How the router ends a request it cannot complete: each failure's status, OpenAI-style
error body and metrics outcome."""
from __future__ import annotations

import httpx
from fastapi.responses import JSONResponse, Response


class Failed(Exception):
    """A request the router ends with `status` and an OpenAI-style error body. `refused`:
    the instance refused the connection, so nothing reached it and another may be tried."""
    status, kind, outcome = 502, "BadGateway", "upstream_error"

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused

    def response(self, request_id: str) -> JSONResponse:
        return JSONResponse(error_body(str(self), self.kind, self.status),
                            status_code=self.status, headers={"X-Request-Id": request_id})


class PrefillFailed(Failed):
    outcome = "prefill_failed"


class DecodeFailed(Failed):
    outcome = "decode_failed"


class TimedOut(Failed):
    status, kind, outcome = 504, "GatewayTimeout", "timeout"


class Unavailable(Failed):
    status, kind, outcome = 503, "ServiceUnavailable", "unavailable"


class Refused(Failed):
    """The prefill instance refused the request itself (a 4xx: too long, bad parameters):
    its status and body go to the client as they are."""
    outcome = "upstream_error"

    def __init__(self, reply: httpx.Response):
        super().__init__(f"the prefill instance answered {reply.status_code}")
        self.reply = reply
        self.status = reply.status_code

    def response(self, request_id: str) -> Response:
        return Response(self.reply.content, status_code=self.status,
                        headers={"X-Request-Id": request_id},
                        media_type=self.reply.headers.get("content-type"))


class ClientGone(Exception):
    pass


def error_body(message: str, kind: str, status: int) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}

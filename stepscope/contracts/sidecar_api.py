"""The bodies that carry a session from the operator (or `stepscope capture`) to the agents
(docs/wire.md): SessionRequest, the body of PUT /v1/sessions/{id} on a sidecar, and
CaptureRequest, the request.json the sidecar writes into the shared directory for every training
process. Both hold the spec's own types, so a capture's settings keep one form, with one set of
defaults, from the ProfileSession to the agent.
"""

from __future__ import annotations

from .schema import Record, SpecError, integer, number, record, string
from .session import CaptureSpec, SessionSpec
from .wire import DEFAULT_HANG_TIMEOUT_SECONDS, MAX_SESSION_ID, WIRE_VERSION

TYPE_CHECKING = False
if TYPE_CHECKING:
    pass

CAPTURE, CANCEL = "capture", "cancel"  # request.json's actions


class StoreCredentials(Record):
    """What the operator read from the session's Secret; never written anywhere, never in a repr."""

    accessKeyId: str = string("The access key id.", required=True, max_length=4096)
    secretAccessKey: str | None = string("The secret access key.", max_length=4096)
    sessionToken: str | None = string("A session token, for temporary credentials.", max_length=4096)

    def __repr__(self) -> str:
        return "StoreCredentials(...)"


class SessionRequest(Record):
    """PUT /v1/sessions/{id}: one session for one sidecar. The same object, without credentials,
    is the session's session.json in the store."""

    session: str = string(
        "The session's id (the ProfileSession's uid): the shared directory's folder name.",
        required=True,
        min_length=1,
        max_length=MAX_SESSION_ID,
    )
    namespace: str = string(
        "The ProfileSession's namespace (empty for `stepscope capture`).", default="", max_length=253
    )
    name: str = string("The ProfileSession's name.", default="", max_length=253)
    destination: str = string(
        "The session's folder in the store: <storage.uri>/<namespace>/<name>-<uid8>.",
        required=True,
        min_length=1,
        max_length=2048,
    )
    spec: SessionSpec = record(SessionSpec, "The ProfileSession's spec.", default={})
    credentials: StoreCredentials | None = record(StoreCredentials, "The store credentials from the session's Secret.")
    startStep: int | None = integer(
        "The absolute step every rank starts capturing at (aligned_start_step over every selected pod).", minimum=0
    )

    def check(self, path: str) -> None:
        if self.destination is None:
            raise SpecError(f"{path}.destination (the session's folder in the store) is required")

    def __repr__(self) -> str:  # the credentials stay out of logs
        return (
            f"SessionRequest(session={self.session!r}, destination={self.destination!r}, startStep={self.startStep!r})"
        )


class CaptureRequest(Record):
    """request.json in the shared directory, which every agent of the pod reads: the latest
    session's capture, or its cancellation. A hand-written one may leave out all but version,
    session and action: the spec's defaults fill in the rest."""

    version: int = integer("The wire version (WIRE_VERSION).", required=True)
    session: str = string("The session's id.", required=True, min_length=1, max_length=MAX_SESSION_ID)
    action: str = string("capture, or cancel the session.", required=True, enum=(CAPTURE, CANCEL))
    capture: CaptureSpec = record(CaptureSpec, "The ProfileSession's spec.capture.", default={})
    hangTimeoutSeconds: int = integer(
        "The ProfileSession's spec.hangTimeoutSeconds.", default=DEFAULT_HANG_TIMEOUT_SECONDS, minimum=1
    )
    issuedAt: float | None = number("When the sidecar wrote it (epoch seconds).")
    startStep: int | None = integer(
        "The absolute step to start capturing at; absent: waitSteps after the rank's own count.", minimum=0
    )


def capture_request(
    session: str, action: str, spec: SessionSpec, start_step: int | None, issued_at: float
) -> CaptureRequest:
    """request.json for a session, as the sidecar writes it."""
    return CaptureRequest(
        version=WIRE_VERSION,
        session=session,
        action=action,
        capture=spec.capture,
        hangTimeoutSeconds=spec.hangTimeoutSeconds,
        issuedAt=issued_at,
        startStep=start_step,
    )

"""The HTTP API (FastAPI): ``POST /search``, ``POST /feedback``, ``GET /unanswered``, ``GET /health`` and, with
``allow_writes``, ``POST /index/add``, ``POST /index/delete`` and ``POST /index/adapt`` (started in the background;
``GET /index/adapt`` says how it went); the OpenAPI page is at ``/docs``.

Bad input is a 4xx with a one-line ``detail``, never a 500: request bodies are validated by pydantic, strictly
(unknown fields and values of another type included; a body that is not UTF-8 JSON is a 422 too), bodies over
`max_body_bytes` get 413 however they are framed, a :class:`~common.runtime.NotFound` (a queue group, an FAQ) is a 404
and a :class:`~common.runtime.MedfaqError` raised by the pipeline becomes 400. A fault of the server's own (a stage
model that cannot load, its index damaged on disk: :class:`~common.runtime.IndexCorrupt`) is a 503, never a 4xx.
When the environment variable ``MEDFAQ_API_KEY`` is set, the write endpoints and the experts' queue need it in the
``X-API-Key`` header; without it the queue, which holds consumers' health questions, is served to loopback clients
only unless `allow_public_queue`, and the index and queue changes (`allow_writes`) are accepted from loopback clients
only unless `allow_public_writes`. :func:`access_rules` says who may do what.

The stage settings a search request may set are those the pipeline's settings (:class:`~retriever.pipeline.
PipelineConfig`'s and each registered stage's, :mod:`retriever.stages`) declare `request` for, by their flat names,
typed strictly from their declarations, bounds and choices included (:func:`setting_field`), and a
value they refuse is refused in :func:`~common.settings.check_setting`'s words, as on the command line; the other
flags name a model, or are read when a stage's model loads, so that each value would load another copy
(docs/http-api.md). A request that sets one declared `needs_key` (the threshold, abstention: what gets queued) sends
its abstained questions to the experts' queue only with the API key.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, Literal

import anyio
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi import Path as PathParameter
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    create_model,
    field_validator,
    model_validator,
)

from medfaq.app.adaptation_job import AdaptationRunning
from medfaq.app.service import SearchService, ServiceStatus, ServiceUnavailable
from medfaq.common.runtime import IndexCorrupt, MedfaqError, NotFound
from medfaq.common.settings import Declared, check_setting
from medfaq.index.records import FaqRecord, record_problem
from medfaq.retriever.decisions.adaptation_config import PARTS, AdaptConfig
from medfaq.retriever.pipeline import pipeline_settings
from medfaq.retriever.search import check_query, invalid_text_position

API_KEY_ENV = "MEDFAQ_API_KEY"


@dataclass
class ServerLimits:
    max_body_bytes: int = 1_000_000
    max_batch: int = 64
    workers: int = 4  # threads running pipeline calls at once (single questions: batched, see SearchService)


class StrictModel(BaseModel):
    """A request body: a field it does not know, or a value of another type (``0`` or ``"off"`` for a bool, ``"3"`` for
    a number), is a 422 naming it, so a typo never silently changes behaviour."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _utf8(value: str | None) -> str | None:
    invalid = None if value is None else invalid_text_position(value)
    if invalid:
        raise ValueError(f"not valid UTF-8 ({invalid})")
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


NonBlank = Annotated[str, AfterValidator(_not_blank)]
"""Text that is not empty or white space alone."""


def setting_field(declared: Declared) -> tuple[Any, Any]:
    """The type and default of a request's optional override of a declared pipeline setting: strict (no bool for a
    number, no text for a number or a bool), within the declaration's bounds and choices."""
    rule = declared.setting
    if rule.choices:
        kind: Any = Literal[rule.choices]
    elif declared.kind is bool:
        kind = StrictBool
    elif declared.kind is int:
        kind = Annotated[StrictInt, Field(ge=rule.ge, gt=rule.gt, le=rule.le)]
    elif declared.kind is float:
        kind = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=rule.ge, gt=rule.gt, le=rule.le)]
    else:
        kind = StrictStr
    return kind | None, Field(None, description=declared.describe())


REQUEST_SETTINGS = {name: declared for name, declared in pipeline_settings().items() if declared.setting.request}
"""The pipeline settings a search request may set for itself."""


class SearchQuestions(StrictModel):
    """One `question` or a batch of `questions`; :class:`SearchRequest` adds the settings."""

    question: str | None = None
    questions: list[str] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_kind(self) -> SearchQuestions:
        if (self.question is None) == (self.questions is None):
            raise ValueError("give either 'question' or 'questions'")
        texts = [self.question] if self.question is not None else self.questions or []
        for position, text in enumerate(texts, 1):
            try:
                check_query(text, "question" if self.question is not None else f"question {position}")
            except MedfaqError as error:
                raise ValueError(str(error)) from None
        return self

    def overrides(self) -> dict[str, Any]:
        """The settings the request set."""
        return self.model_dump(exclude={"question", "questions"}, exclude_none=True)

    def sets_queue_settings(self) -> bool:
        """Whether the request sets a setting that changes what gets queued (declared `needs_key`)."""
        return any(REQUEST_SETTINGS[name].setting.needs_key for name in self.overrides())


SearchRequest = create_model(
    "SearchRequest",
    __base__=SearchQuestions,
    __doc__="One `question` or a batch of `questions`, with optional stage settings named as PipelineConfig fields.",
    **{name: setting_field(declared) for name, declared in REQUEST_SETTINGS.items()},
)


NOT_JSON = "the request body must be a JSON object, sent with the header Content-Type: application/json"


def _setting_refusal(where: str, value: Any) -> str | None:
    """The words of :func:`~common.settings.check_setting` for a request setting's refused `value` (the command line
    refuses it with the same), None where `where` is no request setting."""
    declared = REQUEST_SETTINGS.get(where)
    try:
        if declared is not None:
            check_setting(declared, value)
    except MedfaqError as refusal:
        return str(refusal)
    return None


def _one_line(error: RequestValidationError) -> str:
    """Where and what, without echoing the input (it may hold NaN or lone surrogates JSON cannot carry) except in a
    request setting's refusal, which shows its repr."""
    parts = []
    for item in error.errors():
        where = ".".join(str(part) for part in item.get("loc", ()) if part != "body")
        message = str(item.get("msg", "invalid")).removeprefix("Value error, ")  # our validators' own words
        if item.get("type") == "extra_forbidden":
            message = "unknown field"
        if item.get("type") == "model_attributes_type" and not where:  # no JSON object: a form, text, no type
            message = NOT_JSON
        if item.get("type") == "json_invalid":
            where, message = "", f"the request body is not valid JSON ({item.get('ctx', {}).get('error')}, at {where})"
        message = _setting_refusal(where, item.get("input")) or message
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts) or "invalid request"


class Utf8Request(Request):
    """A request whose JSON body is read as UTF-8 alone (RFC 8259): other bytes are the JSON error FastAPI answers
    with a 422, not a 400."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as error:
                raise json.JSONDecodeError(f"not UTF-8: {error.reason}", "", error.start) from None
            self._json = json.loads(text)
        return self._json


class Utf8Route(APIRoute):
    """Every endpoint reads its body as :class:`Utf8Request`."""

    def get_route_handler(self) -> Any:
        handle = super().get_route_handler()

        async def handle_utf8(request: Request) -> Any:
            return await handle(Utf8Request(request.scope, request.receive))

        return handle_utf8


class FeedbackRequest(StrictModel):
    """Whether the FAQ `faq_id` of the served index answered `question`."""

    question: NonBlank
    faq_id: NonBlank
    helpful: bool
    comment: str | None = None

    _valid_text = field_validator("question", "faq_id", "comment")(_utf8)


class FaqIn(StrictModel):
    """An FAQ to add: the rules of a collection file's lines (:func:`~index.records.record_problem`), checked before
    anything is written."""

    id: str
    question: str
    answer: str = ""
    source: str = ""
    url: str = ""

    _valid_text = field_validator("id", "question", "answer", "source", "url")(_utf8)

    @model_validator(mode="after")
    def _indexable(self) -> FaqIn:
        problem = record_problem(self.record())
        if problem:
            raise ValueError(problem)
        return self

    def record(self) -> FaqRecord:
        return FaqRecord(**{**self.model_dump(), "id": self.id.strip(), "question": self.question.strip()})


class AddRequest(StrictModel):
    faqs: list[FaqIn] = Field(min_length=1)


class DeleteRequest(StrictModel):
    ids: list[str] = Field(min_length=1)


class AdaptRequest(StrictModel):
    """Start `medfaq index adapt` for the served index (or its undo); each part is kept only where it wins."""

    undo: bool = False
    questions: int = Field(AdaptConfig.questions_per_faq, ge=1, le=16, description="Questions written per FAQ.")
    parts: list[Literal["answers", "phrasings", "encoder"]] = Field(default_factory=lambda: list(PARTS), min_length=1)
    labels: Literal["auto", "margin", "hard"] = "auto"


class Detail(BaseModel):
    """Every 4xx and 5xx body: one line saying what is wrong."""

    detail: str


class HitOut(BaseModel):
    id: str
    score: float
    rank: int
    question: str
    answer: str
    source: str
    url: str
    stage_scores: dict[str, float]
    metadata: dict[str, Any]


class SearchOut(BaseModel):
    """What one question produced (``medfaq search --json``)."""

    query: str
    summary: str | None
    entities: list[dict[str, Any]]
    hits: list[HitOut]
    abstained: bool
    timings_ms: dict[str, float]
    confidence: float | None
    truncated: bool


class BatchOut(BaseModel):
    results: list[SearchOut]


class FeedbackOut(BaseModel):
    id: int


class QueueOut(BaseModel):
    questions: list[dict[str, Any]]


class QueuedOut(BaseModel):
    id: int
    text: str
    asked: str
    source: str


class GroupOut(BaseModel):
    """A group of the experts' queue: its questions, how often and when they were asked, and how it was answered."""

    id: int
    title: str
    status: Literal["waiting", "linked", "answered"]
    count: int
    first_asked: str | None
    last_asked: str | None
    questions: list[QueuedOut]
    faq_id: str | None
    resolved_by: str | None
    resolved_at: str | None
    index_version: str | None


class GroupsOut(BaseModel):
    groups: list[GroupOut]


class LinkRequest(StrictModel):
    faq_id: NonBlank
    by: str = ""

    _valid_text = field_validator("faq_id", "by")(_utf8)


class AnswerRequest(StrictModel):
    question: NonBlank
    answer: NonBlank
    by: str = ""

    _valid_text = field_validator("question", "answer", "by")(_utf8)


RowId = Annotated[int, Field(ge=1, le=2**63 - 1)]
"""A queue group's or question's id: a positive SQLite integer."""
GroupId = Annotated[int, PathParameter(ge=1, le=2**63 - 1)]


class SplitRequest(StrictModel):
    question_ids: list[RowId] = Field(min_length=1)


class MergeRequest(StrictModel):
    group_ids: list[RowId] = Field(min_length=2)


class AddOut(BaseModel):
    added: int


class DeleteOut(BaseModel):
    removed: int


class AdaptOut(BaseModel):
    """The served index's adaptation run: idle (none started by this server), running, done or failed."""

    state: Literal["idle", "running", "done", "failed"]
    action: str
    started: str
    finished: str
    error: str
    record: dict[str, Any]


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI description of an endpoint's error answers."""
    meaning = {
        400: "refused by the pipeline",
        401: "missing or wrong API key",
        403: "not allowed on this server",
        404: "no such group in this index's queue, or FAQ in the index",
        409: "an adaptation of this index is running",
        413: "request body or batch too large",
        422: "invalid request",
        503: "a stage of the server is not available",
    }
    return {code: {"model": Detail, "description": meaning[code]} for code in codes}


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is a 413 however it is framed (Content-Length or chunked).

    The body is counted while it streams and never kept past the limit. The rest of a refused body is read and
    dropped, up to `drain_factor` x `max_bytes` and `drain_seconds`, so that a client still sending reads the 413
    instead of a reset connection; then the connection closes. A declared length over that bound is refused at once.
    """

    def __init__(self, app: Any, max_bytes: int, drain_factor: int = 8, drain_seconds: float = 2.0) -> None:
        self.app, self.max_bytes = app, max_bytes
        self.drain_bytes, self.drain_seconds = drain_factor * max_bytes, drain_seconds

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            if int(length) <= self.drain_bytes:
                await self._drop_rest(receive)
            return await self._refuse(scope, receive, send)
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: let the app see it
                return await self.app(scope, _replay([message], receive), send)
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                if more:
                    await self._drop_rest(receive)
                return await self._refuse(scope, receive, send)
        await self.app(scope, _replay([{"type": "http.request", "body": bytes(body)}], receive), send)

    async def _drop_rest(self, receive: Any) -> None:
        budget = self.drain_bytes
        with anyio.move_on_after(self.drain_seconds):
            while budget > 0:
                message = await receive()
                budget -= len(message.get("body", b""))
                if message["type"] != "http.request" or not message.get("more_body"):
                    return

    async def _refuse(self, scope: dict, receive: Any, send: Any) -> None:
        detail = {"detail": f"request body over {self.max_bytes} bytes"}
        await JSONResponse(detail, status_code=413, headers={"connection": "close"})(scope, receive, send)


def _replay(messages: list[dict], receive: Any) -> Any:
    """A `receive` that hands out `messages` first, then the connection's own."""

    async def replayed() -> dict:
        return messages.pop(0) if messages else await receive()

    return replayed


def is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def access_rules(allow_writes: bool, allow_public_queue: bool, allow_public_writes: bool) -> list[str]:
    """Who may do what on a server started with these settings (and ``MEDFAQ_API_KEY`` as set now): one line each
    for the searches and health, the feedback, the queue's reads and the writes."""
    keyed = bool(os.environ.get(API_KEY_ENV))
    with_key = f"clients with the API key ({API_KEY_ENV})"

    def private(public: bool, flag: str) -> str:
        if keyed:
            return with_key
        return f"any client ({flag})" if public else f"loopback clients only (no {API_KEY_ENV}; {flag} opens them)"

    writes = private(allow_public_writes, "--allow-public-writes") if allow_writes else "nobody (no --allow-writes)"
    return [
        "searches (POST /search), health (GET /health) and the adaptation's state (GET /index/adapt): any client",
        f"feedback (POST /feedback): {with_key if keyed else 'any client'}",
        f"the experts' queue (GET /queue, GET /unanswered): {private(allow_public_queue, '--allow-public-queue')}",
        f"index and queue changes (POST /index/..., POST /queue/...): {writes}",
    ]


@dataclass(frozen=True)
class Access:
    """Who may call what: with an API key set, its holders; else loopback clients, unless the server was started to
    open the queue's reads or the writes to everyone. Its methods are the endpoints' FastAPI dependencies."""

    allow_writes: bool = False
    allow_public_queue: bool = False
    allow_public_writes: bool = False

    def require_key(self, x_api_key: str | None = Header(None)) -> None:
        expected = os.environ.get(API_KEY_ENV)
        if expected and x_api_key != expected:
            raise HTTPException(401, f"this endpoint needs the API key ({API_KEY_ENV}) in the X-API-Key header")

    def private(self, request: Request, x_api_key: str | None, public: bool, refusal: str) -> None:
        """The key when one is set; else a loopback client, unless `public`."""
        if os.environ.get(API_KEY_ENV):
            self.require_key(x_api_key)
        elif not public and not is_loopback(request.client.host if request.client else None):
            raise HTTPException(403, refusal)

    def may_read_queue(self, request: Request, x_api_key: str | None = Header(None)) -> None:
        self.private(
            request,
            x_api_key,
            self.allow_public_queue,
            "the experts' queue holds consumers' questions: it is served to loopback clients only "
            f"(set {API_KEY_ENV}, or start the server with --allow-public-queue)",
        )

    def may_write(self, request: Request, x_api_key: str | None = Header(None)) -> None:
        if not self.allow_writes:
            raise HTTPException(403, "the index is read-only: start the server with --allow-writes")
        self.private(
            request,
            x_api_key,
            self.allow_public_writes,
            "changes to the index and the experts' queue are accepted from loopback clients only "
            f"(set {API_KEY_ENV}, or start the server with --allow-public-writes)",
        )


class Workers:
    """The threads the endpoints run the service's work in: `limits.workers` of them, and for single questions, which
    wait in the service's batcher, room for one batch running and the next one filling."""

    def __init__(self, service: SearchService, limits: ServerLimits) -> None:
        self.threads = anyio.CapacityLimiter(limits.workers)
        self.batched = anyio.CapacityLimiter(2 * service.batching.max_size)

    async def run(self, function: Any, *args: Any, limiter: anyio.CapacityLimiter | None = None) -> Any:
        return await anyio.to_thread.run_sync(partial(function, *args), limiter=limiter or self.threads)


def add_error_handlers(app: FastAPI) -> None:
    """Every refusal is one line of JSON: a bad request 422, a user error 400, a running adaptation 409, an unknown
    FAQ or group 404, an index or service that cannot answer 503."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _one_line(error)}, status_code=422)

    for error_type, status in ((MedfaqError, 400), (AdaptationRunning, 409), (NotFound, 404)):
        app.add_exception_handler(error_type, partial(_detail, status=status))
    for error_type in (ServiceUnavailable, IndexCorrupt):
        app.add_exception_handler(error_type, partial(_detail, status=503))


async def _detail(_request: Request, error: Exception, status: int) -> JSONResponse:
    return JSONResponse({"detail": str(error)}, status_code=status)


def add_search_routes(
    app: FastAPI, service: SearchService, limits: ServerLimits, workers: Workers, access: Access
) -> None:
    """Searching, the "Was this helpful?" feedback, and the service's health."""

    @app.post("/search", response_model=SearchOut | BatchOut, responses=errors(400, 413, 422, 503))
    async def search(body: SearchRequest, x_api_key: str | None = Header(None)):
        questions = [body.question] if body.question is not None else body.questions
        if len(questions) > limits.max_batch:
            raise HTTPException(413, f"at most {limits.max_batch} questions per request")
        overrides = body.overrides()
        expected = os.environ.get(API_KEY_ENV)
        if body.sets_queue_settings() and not (expected and x_api_key == expected):
            overrides["log_unanswered"] = False  # its own threshold may not fill the experts' queue
        limiter = workers.batched if len(questions) == 1 else workers.threads
        results = await workers.run(service.search, questions, overrides, limiter=limiter)
        return results[0] if body.question is not None else {"results": results}

    @app.post(
        "/feedback",
        status_code=201,
        dependencies=[Depends(access.require_key)],
        response_model=FeedbackOut,
        responses=errors(400, 401, 404, 413, 422, 503),
    )
    async def feedback(body: FeedbackRequest):
        row = await workers.run(service.add_feedback, body.question, body.faq_id, body.helpful, body.comment)
        return {"id": row}

    @app.get("/health", response_model=ServiceStatus)
    async def health():
        return await workers.run(service.status)


def add_queue_routes(app: FastAPI, service: SearchService, workers: Workers, access: Access) -> None:
    """The experts' queue: the unanswered questions, their groups, and an expert's link, answer, split, undo and
    merge."""
    reads = [Depends(access.may_read_queue)]

    @app.get("/unanswered", dependencies=reads, response_model=QueueOut, responses=errors(401, 403))
    async def unanswered():
        return {"questions": await workers.run(service.unanswered)}

    @app.get("/queue", dependencies=reads, response_model=GroupsOut, responses=errors(400, 401, 403))
    async def queue(status: Literal["waiting", "linked", "answered", "all"] = "waiting"):
        return {"groups": await workers.run(service.queue_groups, None if status == "all" else status)}

    write = dict(
        dependencies=[Depends(access.may_write)],
        response_model=GroupOut,
        responses=errors(400, 401, 403, 404, 413, 422),
    )

    @app.post("/queue/{group_id}/link", **write)
    async def link(group_id: GroupId, body: LinkRequest):
        return await workers.run(partial(service.resolve_group, "link", group_id, **body.model_dump()))

    @app.post("/queue/{group_id}/answer", **write)
    async def answer(group_id: GroupId, body: AnswerRequest):
        return await workers.run(partial(service.resolve_group, "answer", group_id, **body.model_dump()))

    @app.post("/queue/{group_id}/split", **write)
    async def split(group_id: GroupId, body: SplitRequest):
        return await workers.run(partial(service.resolve_group, "split", group_id, **body.model_dump()))

    @app.post("/queue/{group_id}/undo", **write)
    async def undo(group_id: GroupId):
        return await workers.run(service.resolve_group, "undo", group_id)

    @app.post("/queue/merge", **write)
    async def merge(body: MergeRequest):
        return await workers.run(service.merge_groups, body.group_ids)


def add_index_routes(app: FastAPI, service: SearchService, workers: Workers, access: Access) -> None:
    """Changes to the served index: FAQs added and deleted, its adaptation started, undone and followed."""
    write = [Depends(access.may_write)]

    @app.post("/index/add", dependencies=write, response_model=AddOut, responses=errors(400, 401, 403, 413, 422))
    async def add(body: AddRequest):
        return {"added": await workers.run(service.add_faqs, [faq.record() for faq in body.faqs])}

    @app.post("/index/delete", dependencies=write, response_model=DeleteOut, responses=errors(400, 401, 403, 413, 422))
    async def delete(body: DeleteRequest):
        return {"removed": await workers.run(service.delete_faqs, body.ids)}

    @app.post(
        "/index/adapt",
        status_code=202,
        dependencies=write,
        response_model=AdaptOut,
        responses=errors(400, 401, 403, 409, 422),
    )
    async def adapt(body: AdaptRequest):
        settings = {"questions_per_faq": body.questions, "parts": body.parts, "encoder_labels": body.labels}
        return service.adaptation.start(undo=body.undo, **({} if body.undo else settings))

    @app.get("/index/adapt", response_model=AdaptOut)
    async def adaptation_status():
        return service.adaptation.status()


def create_app(
    service: SearchService,
    allow_writes: bool = False,
    limits: ServerLimits | None = None,
    allow_public_queue: bool = False,
    allow_public_writes: bool = False,
) -> FastAPI:
    """The HTTP API over one served index: its searches, the experts' queue and the index's changes, each group of
    endpoints added by its own function."""
    limits = limits or ServerLimits()
    app = FastAPI(title="medfaq", description="Medical FAQ retrieval for consumer health questions.")
    app.router.route_class = Utf8Route
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    add_error_handlers(app)
    access = Access(allow_writes, allow_public_queue, allow_public_writes)
    workers = Workers(service, limits)
    add_search_routes(app, service, limits, workers, access)
    add_queue_routes(app, service, workers, access)
    add_index_routes(app, service, workers, access)
    return app

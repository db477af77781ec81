"""The HTTP API (FastAPI): ``POST /search``, ``POST /feedback``, ``GET /unanswered``, ``GET /health`` and, with
``allow_writes``, ``POST /index/add`` and ``POST /index/delete``; the OpenAPI page is at ``/docs``.

Bad input is a 4xx with a one-line ``detail``, never a 500: request bodies are validated by pydantic, bodies over
`max_body_bytes` get 413, and a :class:`~index.runtime.MedfaqError` raised by the pipeline becomes 400. When the
environment variable ``MEDFAQ_API_KEY`` is set, the write endpoints need it in the ``X-API-Key`` header.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from functools import partial
from typing import Literal

import anyio
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from app.service import SearchService
from index.records import FaqRecord
from index.runtime import MedfaqError
from retriever.search import check_query, invalid_text_position

API_KEY_ENV = "MEDFAQ_API_KEY"


@dataclass
class ServerLimits:
    max_body_bytes: int = 1_000_000
    max_batch: int = 64
    max_top_k: int = 100
    workers: int = 4  # threads running pipeline calls at once


class SearchRequest(BaseModel):
    """One `question` or a batch of `questions`, with optional stage settings named as PipelineConfig fields."""

    question: str | None = None
    questions: list[str] | None = None
    top_k: int | None = Field(None, ge=1)
    mode: Literal["dense", "bm25", "hybrid"] | None = None
    rerank: bool | None = None
    summarize: bool | None = None
    abstain: bool | None = None
    threshold: float | None = None
    query_source: Literal["raw", "summary", "both"] | None = None
    rerank_fusion: Literal["auto", "replace", "rrf"] | None = None
    rerank_margin: float | None = Field(None, ge=0)

    @field_validator("threshold", "rerank_margin")
    @classmethod
    def _finite(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{info.field_name} must be a finite number")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> SearchRequest:
        if (self.question is None) == (self.questions is None):
            raise ValueError("give either 'question' or 'questions'")
        texts = [self.question] if self.question is not None else self.questions or []
        for position, text in enumerate(texts, 1):
            try:
                check_query(text, "question" if self.question is not None else f"question {position}")
            except MedfaqError as error:
                raise ValueError(str(error)) from None
        return self

    def overrides(self) -> dict:
        return self.model_dump(exclude={"question", "questions"}, exclude_none=True)


def _one_line(error: RequestValidationError) -> str:
    """Where and what, without echoing the input (it may hold NaN or lone surrogates JSON cannot carry)."""
    parts = []
    for item in error.errors():
        where = ".".join(str(part) for part in item.get("loc", ()) if part != "body")
        message = str(item.get("msg", "invalid")).removeprefix("Value error, ")  # our validators' own words
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts) or "invalid request"


class FeedbackRequest(BaseModel):
    question: str = Field(min_length=1)
    faq_id: str = Field(min_length=1)
    helpful: bool
    comment: str | None = None

    @field_validator("question", "faq_id", "comment")
    @classmethod
    def _utf8(cls, value: str | None) -> str | None:
        invalid = None if value is None else invalid_text_position(value)
        if invalid:
            raise ValueError(f"not valid UTF-8 ({invalid})")
        return value


class FaqIn(BaseModel):
    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    answer: str = ""
    source: str = ""
    url: str = ""


class AddRequest(BaseModel):
    faqs: list[FaqIn] = Field(min_length=1)


class DeleteRequest(BaseModel):
    ids: list[str] = Field(min_length=1)


def create_app(service: SearchService, allow_writes: bool = False, limits: ServerLimits | None = None) -> FastAPI:
    limits = limits or ServerLimits()
    app = FastAPI(title="medfaq", description="Medical FAQ retrieval for consumer health questions.")
    threads = anyio.CapacityLimiter(limits.workers)

    async def run_in_threadpool(function, *args):
        return await anyio.to_thread.run_sync(partial(function, *args), limiter=threads)

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
            return JSONResponse({"detail": f"request body over {limits.max_body_bytes} bytes"}, status_code=413)
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _one_line(error)}, status_code=422)

    @app.exception_handler(MedfaqError)
    async def user_error(_request: Request, error: MedfaqError) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=400)

    def require_key(x_api_key: str | None = Header(None)) -> None:
        expected = os.environ.get(API_KEY_ENV)
        if expected and x_api_key != expected:
            raise HTTPException(401, f"this endpoint needs the API key ({API_KEY_ENV}) in the X-API-Key header")

    def require_writes() -> None:
        if not allow_writes:
            raise HTTPException(403, "the index is read-only: start the server with --allow-writes")

    @app.post("/search")
    async def search(body: SearchRequest):
        questions = [body.question] if body.question is not None else body.questions
        if len(questions) > limits.max_batch:
            raise HTTPException(413, f"at most {limits.max_batch} questions per request")
        if body.top_k is not None and body.top_k > limits.max_top_k:
            raise HTTPException(422, f"top_k must be at most {limits.max_top_k}")
        results = await run_in_threadpool(service.search, questions, body.overrides())
        return results[0] if body.question is not None else {"results": results}

    @app.post("/feedback", status_code=201, dependencies=[Depends(require_key)])
    async def feedback(body: FeedbackRequest):
        row = await run_in_threadpool(service.add_feedback, body.question, body.faq_id, body.helpful, body.comment)
        return {"id": row}

    @app.get("/unanswered")
    async def unanswered():
        return {"questions": await run_in_threadpool(service.unanswered)}

    @app.get("/health")
    async def health():
        return {"status": "ok", **asdict(await run_in_threadpool(service.status))}

    @app.post("/index/add", dependencies=[Depends(require_writes), Depends(require_key)])
    async def add(body: AddRequest):
        records = [FaqRecord(**faq.model_dump()) for faq in body.faqs]
        return {"added": await run_in_threadpool(service.add_faqs, records)}

    @app.post("/index/delete", dependencies=[Depends(require_writes), Depends(require_key)])
    async def delete(body: DeleteRequest):
        return {"removed": await run_in_threadpool(service.delete_faqs, body.ids)}

    return app

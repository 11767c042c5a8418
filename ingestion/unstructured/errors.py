"""Errors of the remote parser client: :class:`~ingestion.parsing.ParseError` subclasses with
stable codes.

``retryable`` tells the durable compilation layer whether a whole new attempt may help later;
the client itself retries inline only explicit retryable statuses (see
:mod:`ingestion.unstructured.client`). Messages are client-safe: they name the limit, the
setting or the HTTP status, never the API key or a document's content.
"""

from __future__ import annotations

from ingestion.parsing.errors import ParseError


class UnstructuredError(ParseError):
    """Base of the remote parser's failures (code ``parser_error``)."""

    code = "parser_error"
    #: Whether a later, durable retry of the whole attempt may succeed.
    retryable = False


class ParserNotConfigured(UnstructuredError):
    """``UNSTRUCTURED_API_URL`` is not set (code ``parser_not_configured``)."""

    code = "parser_not_configured"


class ParserInputTooLarge(UnstructuredError):
    """The document is larger than ``UNSTRUCTURED_MAX_INPUT_BYTES``; refused before sending
    (code ``parser_input_too_large``)."""

    code = "parser_input_too_large"


class ParserUnavailable(UnstructuredError):
    """The parser could not be reached (connection refused, DNS) or kept answering a retryable
    status (429/502/503/504) (code ``parser_unavailable``; retryable)."""

    code = "parser_unavailable"
    retryable = True


class ParserTimeout(UnstructuredError):
    """The request, response body included, did not finish within its total deadline (code
    ``parser_timeout``). Terminal: the parser may still be working on the document."""

    code = "parser_timeout"


class ParserConnectionLost(UnstructuredError):
    """The connection broke after the document was sent (code ``parser_connection_lost``).
    Terminal like a timeout: the parser may still be working on the document."""

    code = "parser_connection_lost"


class ParserRejected(UnstructuredError):
    """The parser refused the request with a 4xx status (code ``parser_rejected``); the message
    names the status."""

    code = "parser_rejected"

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class ParserFailed(UnstructuredError):
    """The parser failed with a non-retryable 5xx status, e.g. 500 (code ``parser_failed``)."""

    code = "parser_failed"

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class ParserResponseTooLarge(UnstructuredError):
    """The response body exceeds ``UNSTRUCTURED_MAX_RESPONSE_BYTES`` (code
    ``parser_response_too_large``); reading stops at the cap."""

    code = "parser_response_too_large"


class ParserInvalidResponse(UnstructuredError):
    """The response is not a JSON list of elements (code ``parser_invalid_response``)."""

    code = "parser_invalid_response"


class ParserEmptyOutput(UnstructuredError):
    """The parser answered no element with text (code ``parser_empty_output``): never reported
    as a successful parse."""

    code = "parser_empty_output"

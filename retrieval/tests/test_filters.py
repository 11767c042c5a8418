"""Retrieval filters: every operator, the limits and their error codes, and the pushdown into
both legs before their limit (on SQLite and PostgreSQL, whichever the run uses)."""

from __future__ import annotations

import uuid

import pytest

from ingestion.availability import set_document_availability
from ingestion.documents import admit_document
from ingestion.models import Document
from knowledgefs.errors import InvalidInput
from knowledgefs.testing.fixtures import compile_all
from retrieval import filters
from retrieval.modes import retrieve

META = {
    "team": "Field Research",
    "tags": "",
    "owner": None,
    "pages": 12,
    "price": "7.5",
    "published": "2024-05-01",
    "reviewed": "2024-05-01T09:30:00+02:00",
    "secret": True,
    "draft": "false",
}


def cond(name, field_type, operator, value=None, **extra):
    c = {"name": name, "field_type": field_type, "comparison_operator": operator}
    if value is not None or extra.get("explicit"):
        c["value"] = value
    return c


def matches(condition, metadata=META) -> bool:
    return filters.parse({"conditions": [condition]}).matches_metadata(metadata)


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        (cond("team", "string", "is", "Field Research"), True),
        (cond("team", "string", "is", "field research"), False),  # case-sensitive
        (cond("team", "string", "is not", "Office"), True),
        (cond("missing", "string", "is not", "Office"), True),  # complement of "is"
        (cond("team", "string", "contains", "Research"), True),
        (cond("team", "string", "not contains", "Research"), False),
        (cond("team", "string", "starts with", "Field"), True),
        (cond("team", "string", "ends with", "Field"), False),
        (cond("team", "string", "in", ["Office", "Field Research"]), True),
        (cond("team", "string", "not in", ["Office", "Field Research"]), False),
        (cond("pages", "string", "is", "12"), False),  # a number is not a string
        (cond("tags", "string", "is empty"), True),  # ""
        (cond("owner", "string", "is empty"), True),  # null
        (cond("missing", "string", "is empty"), True),  # key missing
        (cond("team", "string", "is empty"), False),
        (cond("tags", "string", "is not empty"), False),
        (cond("team", "string", "is not empty"), True),
        (cond("pages", "number", "=", 12), True),
        (cond("pages", "number", "≠", 12), False),
        (cond("pages", "number", "!=", 11), True),
        (cond("pages", "number", ">", 11.5), True),
        (cond("pages", "number", "<", 12), False),
        (cond("pages", "number", "≥", 12), True),
        (cond("pages", "number", ">=", 13), False),
        (cond("pages", "number", "≤", 12), True),
        (cond("pages", "number", "<=", 11), False),
        (cond("price", "number", "=", 7.5), True),  # a numeric string compares numerically
        (cond("team", "number", ">", 0), False),
        (cond("pages", "number", "is empty"), False),
        (cond("owner", "number", "is empty"), True),
        (cond("pages", "number", "is not empty"), True),
        (cond("published", "date", "is", "2024-05-01"), True),
        (cond("published", "date", "before", "2024-05-02"), True),
        (cond("published", "date", "after", "2024-05-01T00:00:00Z"), False),
        (cond("reviewed", "date", "is", "2024-05-01"), True),  # 07:30 UTC that day
        (cond("reviewed", "date", "is", "2024-05-01T07:30:00Z"), True),
        (cond("reviewed", "date", "after", "2024-05-01T07:00:00Z"), True),
        (cond("team", "date", "before", "2030-01-01"), False),  # not a date
        (cond("missing", "date", "is empty"), True),
        (cond("published", "date", "is not empty"), True),
        (cond("secret", "boolean", "is", True), True),
        (cond("secret", "boolean", "is", False), False),
        (cond("draft", "boolean", "is", False), True),  # a stored "false" string counts
        (cond("missing", "boolean", "is", False), False),
    ],
)
def test_every_operator(condition, expected):
    assert matches(condition) is expected


def test_and_or_combine_conditions():
    yes = cond("pages", "number", ">", 1)
    no = cond("secret", "boolean", "is", False)
    assert filters.parse({"conditions": [yes, no]}).matches_metadata(META) is False
    assert (
        filters.parse({"logical_operator": "or", "conditions": [yes, no]}).matches_metadata(META)
        is True
    )
    assert filters.parse({}) is None and filters.parse(None) is None


def error(raw) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        filters.parse(raw)
    return caught.value


def test_fifty_conditions_pass_and_fifty_one_are_refused():
    fifty = [cond("pages", "number", ">", i) for i in range(50)]
    assert len(filters.parse({"conditions": fifty}).conditions) == 50
    refused = error({"conditions": [*fifty, cond("pages", "number", ">", 0)]})
    assert refused.code == "too_many_filter_conditions"
    assert refused.message == "filters.conditions has 51 conditions; the limit is 50"


@pytest.mark.parametrize(
    ("raw", "code", "message"),
    [
        ([], "invalid_filter", "filters must be a JSON object or null"),
        ({"tags": ["a"]}, "invalid_filter", "filters.tags is not a filter member"),
        ({"logical_operator": "xor"}, "invalid_filter", "filters.logical_operator must be"),
        (
            {"conditions": [cond("a", "number", "contains", 1)]},
            "invalid_filter",
            "filters.conditions[0].comparison_operator 'contains' is not an operator for number",
        ),
        (
            {"conditions": [cond("a", "number", ">", 1), cond("a", "text", "is", "x")]},
            "invalid_filter",
            "filters.conditions[1].field_type must be one of: string, number, date, boolean",
        ),
        ({"conditions": [cond("", "string", "is", "x")]}, "invalid_filter",
         "filters.conditions[0].name must be"),
        ({"conditions": [cond("a", "number", "=", "12")]}, "invalid_filter",
         "filters.conditions[0].value must be a finite number"),
        ({"conditions": [cond("a", "date", "before", "May 1st")]}, "invalid_filter",
         "filters.conditions[0].value 'May 1st' is not an ISO 8601 date"),
        ({"conditions": [cond("a", "boolean", "is", "yes")]}, "invalid_filter",
         "filters.conditions[0].value must be true or false"),
        ({"conditions": [cond("a", "string", "is empty", "x")]}, "invalid_filter",
         "filters.conditions[0].value must be null"),
        ({"conditions": [cond("a", "string", "in", "x")]}, "invalid_filter",
         "filters.conditions[0].value must be a list of strings"),
        ({"conditions": [cond("a", "string", "in", ["x"] * 101)]}, "too_many_filter_values",
         "filters.conditions[0].value lists 101 values; the limit is 100"),
        ({"document_ids": [str(uuid.uuid4())] * 101}, "too_many_filter_values",
         "filters.document_ids lists 101 ids; the limit is 100"),
        ({"document_ids": ["nope"]}, "invalid_filter", "filters.document_ids[0] is not a"),
        ({"document_types": ["pdf"]}, "invalid_filter", "filters.document_types must be a list"),
        ({"created_after": "yesterday"}, "invalid_filter", "filters.created_after 'yesterday'"),
    ],
)  # fmt: skip
def test_bad_filters_name_the_member_and_the_limit(raw, code, message):
    refused = error(raw)
    assert refused.code == code
    assert refused.message.startswith(message), refused.message


# --- pushed into both legs ------------------------------------------------------------------------


@pytest.fixture
def handbook(space):
    rows = {
        "leave-hr.txt": ("Annual leave policy: staff get 28 days of paid leave.", {"team": "hr"}),
        "leave-ops.txt": (
            "Leave rota for operators: annual leave is planned in March.",
            {"team": "ops", "pages": 3},
        ),  # fmt: skip
        "leave-old.md": (
            "# Leave\n\nThe old annual leave policy granted 20 days.",
            {"team": "hr", "archived": True},
        ),  # fmt: skip
    }
    docs = {}
    for name, (text, meta) in rows.items():
        docs[name] = admit_document(
            space, filename=name, data=text.encode(), metadata=meta, enqueue=False
        ).document
    compile_all()
    return space, docs


def names(result) -> list[str]:
    return sorted(i.citation["filename"] for i in result.items)


TEAM_HR = {"conditions": [cond("team", "string", "is", "hr")]}


@pytest.mark.django_db
@pytest.mark.parametrize("legs", [("keyword",), ("dense",), ("dense", "keyword")])
def test_filters_restrict_each_leg(handbook, legs):
    space, docs = handbook
    everything = retrieve(space, "annual leave policy", top_k=10, legs=legs)
    assert names(everything) == ["leave-hr.txt", "leave-old.md", "leave-ops.txt"]
    hr = retrieve(space, "annual leave policy", top_k=10, legs=legs, filters=TEAM_HR)
    assert names(hr) == ["leave-hr.txt", "leave-old.md"]
    current = {"conditions": [*TEAM_HR["conditions"], cond("archived", "boolean", "is", True)]}
    archived = retrieve(space, "annual leave policy", top_k=10, legs=legs, filters=current)
    assert names(archived) == ["leave-old.md"]
    either = {
        "logical_operator": "or",
        "conditions": [cond("pages", "number", "≥", 3), cond("archived", "boolean", "is", True)],
    }
    assert names(retrieve(space, "annual leave", top_k=10, legs=legs, filters=either)) == [
        "leave-old.md",
        "leave-ops.txt",
    ]
    by_id = {"document_ids": [str(docs["leave-ops.txt"].id)]}
    assert names(retrieve(space, "annual leave", top_k=10, legs=legs, filters=by_id)) == [
        "leave-ops.txt"
    ]
    markdown = {"document_types": ["text/markdown"]}
    assert names(retrieve(space, "annual leave", top_k=10, legs=legs, filters=markdown)) == [
        "leave-old.md"
    ]
    empty = {"conditions": [cond("pages", "number", "is empty")]}
    assert names(retrieve(space, "annual leave", top_k=10, legs=legs, filters=empty)) == [
        "leave-hr.txt",
        "leave-old.md",
    ]


@pytest.mark.django_db
def test_a_filter_that_matches_nothing_returns_nothing_without_searching(handbook):
    space, _ = handbook
    nobody = {"conditions": [cond("team", "string", "is", "finance")]}
    result = retrieve(space, "annual leave", top_k=10, filters=nobody)
    assert result.items == []
    status = {s["name"]: s["status"] for s in result.stages}
    assert status["filter"] == "executed"
    assert [status[n] for n in ("embed", "dense", "keyword", "fusion")] == ["skipped"] * 4
    stage = next(s for s in result.stages if s["name"] == "filter")
    assert (stage["candidate_count"], stage["filtered_count"]) == (3, 3)
    assert result.metrics["metadata_filtered_documents"] == 3
    later = {"created_after": "2999-01-01T00:00:00Z"}
    assert retrieve(space, "annual leave", top_k=10, filters=later).items == []
    earlier = {"created_before": "2999-01-01"}
    assert len(retrieve(space, "annual leave", top_k=10, filters=earlier).items) == 3


@pytest.mark.django_db
def test_disabled_documents_are_never_returned_even_when_a_filter_names_them(handbook):
    space, docs = handbook
    hr = docs["leave-hr.txt"]
    set_document_availability(hr.id, False, Document.objects.get(id=hr.id).row_version)
    named = {"document_ids": [str(hr.id)]}
    for legs in (("keyword",), ("dense",), ("dense", "keyword")):
        assert retrieve(space, "annual leave", top_k=10, legs=legs, filters=named).items == []
        assert "leave-hr.txt" not in names(retrieve(space, "annual leave", top_k=10, legs=legs))


@pytest.mark.django_db
@pytest.mark.parametrize("legs", [("keyword",), ("dense",)])
def test_the_filter_is_applied_before_the_limit_not_to_a_truncated_list(space, legs):
    # 55 documents match "apple" better than the one the filter allows: a leg that read its 50
    # best candidates and filtered them afterwards would find nothing.
    for i in range(55):
        admit_document(
            space,
            filename=f"apple-{i}.txt",
            data=f"Apple apple apple orchard {i}.".encode(),
            metadata={"team": "a"},
            enqueue=False,
        )
    admit_document(
        space,
        filename="wanted.txt",
        data=b"Quarterly budget review with one apple on the agenda and many other topics.",
        metadata={"team": "b"},
        enqueue=False,
    )
    compile_all()
    team_b = {"conditions": [cond("team", "string", "is", "b")]}
    result = retrieve(space, "apple", top_k=1, legs=legs, filters=team_b)
    assert names(result) == ["wanted.txt"]
    assert result.plan["dense_top_k"] == 50
    unfiltered = retrieve(space, "apple", top_k=50, legs=legs)
    assert "wanted.txt" not in names(unfiltered)


@pytest.mark.django_db
def test_filter_errors_over_http(client, handbook):
    space, _ = handbook
    url = f"/v1/knowledge-spaces/{space.id}/retrieval-tests"
    many = {"conditions": [cond("pages", "number", ">", i) for i in range(51)]}
    answer = client.post(url, {"query": "leave", "filters": many}, format="json")
    assert answer.status_code == 400
    assert answer.json()["code"] == "too_many_filter_conditions"
    assert answer.json()["message"] == "filters.conditions has 51 conditions; the limit is 50"
    bad = client.post(
        url, {"query": "leave", "filters": {"conditions": [cond("x", "date", "is", 3)]}},
        format="json",
    )  # fmt: skip
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_filter"
    assert bad.json()["details"] == {"field": "filters.conditions[0].value"}
    ok = client.post(url, {"query": "leave", "filters": TEAM_HR}, format="json").json()
    assert sorted(i["citation"]["filename"] for i in ok["items"]) == [
        "leave-hr.txt",
        "leave-old.md",
    ]
    stage = next(s for s in ok["stages"] if s["name"] == "filter")
    assert stage["status"] == "executed" and stage["filtered_count"] == 1


# --- values beyond a double's or a datetime's range ----------------------------------------------

HUGE = 10**400  # a 401-digit integer: JSON allows it, float() refuses it (OverflowError)


@pytest.mark.parametrize(
    ("stored", "condition"),
    [
        (HUGE, cond("v", "number", ">", 1)),
        (-HUGE, cond("v", "number", "<", 1)),
        ("1" + "0" * 400, cond("v", "number", ">", 1)),  # a string parses to inf: no match
        ("1_000", cond("v", "number", "=", 1000)),  # float() would accept it
        ("٣", cond("v", "number", "=", 3)),  # Arabic-Indic three
        ("inf", cond("v", "number", ">", 1)),
        (" nan ", cond("v", "number", ">", 1.5)),
        ("9999-12-31T23:59:59-14:00", cond("v", "date", "after", "2000-01-01")),
        ("0001-01-01T00:00:00+01:00", cond("v", "date", "before", "2000-01-01")),
        ("9999-12-31T23:59:59-14:00", cond("v", "date", "is", "9999-12-31")),
    ],
)
def test_stored_values_that_cannot_be_compared_match_no_positive_operator(stored, condition):
    assert matches(condition, {"v": stored}) is False
    if condition["field_type"] == "number":  # "≠" is the exact complement of "="
        assert matches({**condition, "comparison_operator": "≠"}, {"v": stored}) is True


@pytest.mark.parametrize(
    ("stored", "expected"), [("7.5", True), ("+7.50", True), (" 75e-1 ", True), ("7,5", False)]
)
def test_plain_ascii_decimal_strings_compare_as_numbers(stored, expected):
    assert matches(cond("v", "number", "=", 7.5), {"v": stored}) is expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"conditions": [cond("a", "number", "<", HUGE)]},
         "filters.conditions[0].value must be a finite number within ±1.7976931348623157e308"),
        ({"conditions": [cond("a", "date", "before", "9999-12-31T23:59:59-14:00")]},
         "filters.conditions[0].value '9999-12-31T23:59:59-14:00' is out of range: dates must "
         "lie within 0001-01-01T00:00:00Z … 9999-12-31T23:59:59.999999Z in UTC"),
        ({"created_after": "0001-01-01T00:00:00+01:00"},
         "filters.created_after '0001-01-01T00:00:00+01:00' is out of range"),
        ({"created_before": "9999-12-31T23:59:59-01:00"},
         "filters.created_before '9999-12-31T23:59:59-01:00' is out of range"),
    ],
)  # fmt: skip
def test_request_values_out_of_range_are_invalid_filter(raw, message):
    refused = error(raw)
    assert refused.code == "invalid_filter"
    assert refused.message.startswith(message), refused.message


@pytest.mark.django_db
def test_stored_out_of_range_metadata_does_not_break_the_space(client, handbook):
    space, _ = handbook
    admit_document(
        space,
        filename="poison.txt",
        data=b"Annual leave poison document.",
        metadata={"pages": HUGE, "published": "9999-12-31T23:59:59-14:00"},
        enqueue=False,
    )
    compile_all()
    url = f"/v1/knowledge-spaces/{space.id}/retrieval-tests"
    pages = {"conditions": [cond("pages", "number", ">", 1)]}
    ok = client.post(url, {"query": "annual leave", "filters": pages}, format="json")
    assert ok.status_code == 200, ok.content
    assert [i["citation"]["filename"] for i in ok.json()["items"]] == ["leave-ops.txt"]
    published = {"conditions": [cond("published", "date", "after", "2000-01-01")]}
    none = client.post(url, {"query": "annual leave", "filters": published}, format="json")
    assert none.status_code == 200 and none.json()["items"] == []
    early = {"created_after": "0001-01-01T00:00:00+01:00"}
    refused = client.post(url, {"query": "annual leave", "filters": early}, format="json")
    assert refused.status_code == 400 and refused.json()["code"] == "invalid_filter"
    assert refused.json()["details"] == {"field": "filters.created_after"}

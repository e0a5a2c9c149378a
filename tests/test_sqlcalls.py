"""The module of SQL calls: its defaults are the generation config's, and the SQL functions' own
defaults are the same values (read from pg_proc, not from a list kept by hand)."""

from __future__ import annotations

import re

import psycopg
import pytest

from hartonomous import sqlcalls
from hartonomous.errors import UserError
from hartonomous.generation_config import GenerationConfig, SamplerArgs
from hartonomous.sqlcalls import SpatialArgs

SAMPLER_FIELDS = ("temperature", "top_k", "top_p", "repetition_penalty")
CALLED = ("next_token", "next_token_batch", "sample_next_token", "generate_tokens", "context_centroid")


def sql_defaults(conn: psycopg.Connection, function: str) -> dict[str, str]:
    """{argument: default expression} of a SQL function, from pg_get_function_arguments."""
    (args,) = conn.execute("SELECT pg_get_function_arguments(p.oid) FROM pg_proc p "
                           "JOIN pg_namespace n ON n.oid = p.pronamespace "
                           "WHERE n.nspname = 'public' AND p.proname = %s", (function,)).fetchone()
    out = {}
    for part in re.split(r",\s*(?![^()]*\))", args):
        match = re.match(r"(\w+) [^=]*?(?: DEFAULT (.*))?$", part.strip())
        if match and match.group(2) is not None:
            out[match.group(1)] = match.group(2)
    return out


def as_python(expression: str):
    value = expression.split("::")[0].strip("'")
    if value == "NULL":
        return None
    return float(value)


@pytest.mark.parametrize("function", ["next_token", "next_token_batch", "sample_next_token", "generate_tokens"])
def test_sql_sampler_defaults_equal_the_generation_config(conn, function):
    defaults = sql_defaults(conn, function)
    config = GenerationConfig()
    for name in SAMPLER_FIELDS:
        assert as_python(defaults[name]) == getattr(config, name), (function, name)
    spatial = SpatialArgs()
    assert as_python(defaults["max_neighbors"]) == spatial.max_neighbors
    assert as_python(defaults["search_radius"]) is spatial.search_radius is None


def test_calls_without_a_sampler_use_the_generation_config():
    query = sqlcalls.next_token_query([1, 2])
    config = GenerationConfig()
    assert {name: query.params[name] for name in SAMPLER_FIELDS} == {name: getattr(config, name)
                                                                       for name in SAMPLER_FIELDS}


def test_every_called_function_exists_with_the_arguments_the_module_names(conn):
    """Each query's named arguments are arguments of the installed function."""
    queries = {
        "next_token": sqlcalls.next_token_query([1, 2]),
        "next_token_batch": sqlcalls.next_token_batch_query([[1, 2]]),
        "sample_next_token": sqlcalls.sample_next_token_query([1, 2]),
        "generate_tokens": sqlcalls.generate_tokens_query([1, 2], 3),
        "context_centroid": sqlcalls.context_centroid_query([1, 2]),
    }
    assert set(queries) == set(CALLED)
    for function, query in queries.items():
        (args,) = conn.execute("SELECT string_agg(pg_get_function_arguments(p.oid), ' ') FROM pg_proc p "
                               "WHERE p.proname = %s", (function,)).fetchone()
        named = re.findall(r"(\w+) => ", query.sql)
        assert named, function
        for name in named:
            assert re.search(rf"\b{name}\b", args), (function, name)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_neighbors": 0}, "max_neighbors must be between 1 and 100000"),
    ({"max_neighbors": 100_001}, "max_neighbors must be between 1 and 100000"),
    ({"search_radius": 0.0}, "search_radius must be > 0"),
    ({"search_radius": -1.0}, "search_radius must be > 0"),
])
def test_spatial_args_are_validated_where_they_are_made(kwargs, message):
    with pytest.raises(UserError, match=message):
        SpatialArgs(**kwargs)


def test_bad_sql_input_becomes_a_user_error_naming_the_argument(conn):
    with pytest.raises(UserError, match="top_p"):
        sqlcalls.next_token(conn, [1, 2], SamplerArgs(temperature=1.0, top_k=40, top_p=1.5, repetition_penalty=1.0))

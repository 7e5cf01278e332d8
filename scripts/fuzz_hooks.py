"""Schemathesis hooks for `make fuzz-api`: control characters in the strings it generates.

Left to itself, schemathesis rarely draws a NUL or an escape inside a string, and those are
what once turned bad input into a 500 (Postgres refuses NUL in text and jsonb). These hooks
put one control character (C0, DEL or C1, tab and line breaks included) into about half of the
string values of bodies, query strings and path parameters, at a position hypothesis draws, so
the seeded run is reproducible and shrinks like any other. Object members keep their names
except inside nested objects (metadata keys), which get them too.
"""

import schemathesis
from hypothesis import strategies as st

CONTROLS = ["\x00", "\x01", "\x07", "\x08", "\x0b", "\x0c", "\x1b", "\x7f", "\x85", "\t", "\n", "\r"]


@st.composite
def with_controls(draw, value, depth=0):
    if isinstance(value, str):
        if not draw(st.booleans()):
            return value
        at = draw(st.integers(min_value=0, max_value=len(value)))
        return value[:at] + draw(st.sampled_from(CONTROLS)) + value[at:]
    if isinstance(value, list):
        return [draw(with_controls(item, depth + 1)) for item in value]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            name = draw(with_controls(key, depth + 1)) if depth > 0 and isinstance(key, str) else key
            out[name] = draw(with_controls(item, depth + 1))
        return out
    return value


@schemathesis.hook
def flatmap_body(ctx, body):
    return with_controls(body)


@schemathesis.hook
def flatmap_query(ctx, query):
    return with_controls(query) if query else st.just(query)


@schemathesis.hook
def flatmap_path_parameters(ctx, path_parameters):
    return with_controls(path_parameters) if path_parameters else st.just(path_parameters)

"""anyOf nested 900 deep (1,800 JSON levels, inside the parser's 2,048): a 400 naming the 128-level limit."""
import json

EXPECT = 400


def request():
    # Built as text: Python's json module recurses, and stops near 1,000 levels.
    schema = '{"type": "integer"}'
    for _ in range(900):
        schema = '{"anyOf": [{"type": "null"}, ' + schema + ']}'
    body = '{"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, ' \
        '"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": ' + schema + '}}}'
    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, body.encode())

"""Repetitions that would write out 1,000,000 helper rules: a 400 naming the rule limit, at once."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    body["grammar"] = "root ::= " + '"a"{0,10000} ' * 100 + "\n"

    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())

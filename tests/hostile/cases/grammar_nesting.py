"""GBNF of 30,000 nested groups (issue #62: crashed the server on parse.c's recursion): a 400 naming the 256-level limit."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    body["grammar"] = "root ::= " + "(" * 30000 + '"a"' + ")" * 30000

    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())

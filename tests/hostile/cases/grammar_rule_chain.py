"""A GBNF chain of 100,000 rules, each starting with the next (the automaton's expansion once recursed on it): served."""
import json

EXPECT = 200


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    rules = ["root ::= r0"] + ["r%d ::= r%d" % (i, i + 1) for i in range(100000)] + ['r100000 ::= "x" | "y"']
    body["grammar"] = "\n".join(rules) + "\n"

    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())

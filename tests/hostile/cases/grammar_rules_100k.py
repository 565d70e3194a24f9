"""A GBNF of 100,000 rules, each calling the next (214 s of compile before #62, and a chain the
automaton followed by recursion): served, or refused by the compile-time limit (a slower build),
within 2 s of the server's CPU, while other clients are answered."""
import json

EXPECT = (200, 400)
CPU_LIMIT = 2.0
ALONGSIDE = True


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    rules = ["root ::= r0"] + ['r%d ::= "a" r%d | "b"' % (i, i + 1) for i in range(100000)] + ['r100000 ::= "c"']
    body["grammar"] = "\n".join(rules) + "\n"

    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())

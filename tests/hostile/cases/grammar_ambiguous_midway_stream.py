"""The grammar of grammar_ambiguous_midway.py in a stream: the answer's text so far, then an error
event of the request's kind (invalid_request_error), not the server's."""
import json

EXPECT = 200


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "Say a"}], "max_tokens": 32, "ignore_eos": True, "stream": True,
            "grammar": 'root ::= ("a" | "a" root+){2,5}\n'}
    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
    errors = [json.loads(e)["error"] for e in events if e.startswith('{"error"')]
    if len(errors) != 1 or errors[0]["type"] != "invalid_request_error" or errors[0]["code"] != "grammar_too_ambiguous":
        return "no error event of the grammar's kind: %r" % events[-3:]
    return None

"""A grammar that starts well and turns too ambiguous to follow as the answer grows (its parses
multiply with every "a"; ignore_eos keeps the answer going): a 400 naming the grammar, not a 500."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "Say a"}], "max_tokens": 32, "ignore_eos": True,
            "grammar": 'root ::= ("a" | "a" root+){2,5}\n'}
    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    error = json.loads(body)["error"]
    if error["code"] != "grammar_too_ambiguous" or error["param"] != "grammar" or "too ambiguous" not in error["message"]:
        return "not the grammar's error: %s" % error
    return None

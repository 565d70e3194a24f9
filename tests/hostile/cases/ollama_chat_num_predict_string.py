"""Ollama's API, options.num_predict a string: a 400 in Ollama's format ({"error": "..."}) naming num_predict."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": "10"}}
    return ("POST", "/api/chat", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "num_predict" not in answer["error"]:
        return "not Ollama's error naming num_predict: %s" % answer
    return None

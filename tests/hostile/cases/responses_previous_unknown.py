"""A Responses request continuing a response the server never stored: a 400 naming
previous_response_id with OpenAI's code, as OpenAI answers it (Codex and the SDKs read the code)."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "previous_response_id": "resp_" + "0" * 40, "input": "and then?"}
    return ("POST", "/v1/responses", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    error = json.loads(body)["error"]
    if error.get("code") != "previous_response_not_found" or error.get("param") != "previous_response_id":
        return "not previous_response_not_found naming the field: %s" % error
    return None

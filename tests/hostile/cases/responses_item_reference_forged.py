"""item_reference ids shaped to trip the parser of an item id ("<kind>_<response id>_<index>"): no
underscore, an index past any integer, a negative or empty index, a response id of underscores, an
id of 100,000 characters. Each is an unknown item: a 400 naming the first one, never a crash."""
import json

EXPECT = 400

IDS = ["fc", "fc_", "fc__", "fc_resp_1_", "fc_resp_1_-1", "fc_resp_1_99999999999999999999999999", "fc_" + "_" * 500 + "1",
       "msg_resp_1_1x", "rs_" + "a" * 100000 + "_0"]


def request():
    body = {"model": "x", "input": [{"role": "user", "content": "hi"}] + [{"type": "item_reference", "id": i} for i in IDS]}
    return ("POST", "/v1/responses", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    error = json.loads(body)["error"]
    if error.get("code") != "item_not_found" or error.get("param") != "input[1].id":
        return "not item_not_found naming input[1].id: %s" % error
    return None

#!/usr/bin/env python3
"""WordNet 3.0 (Debian package wordnet-base) -> the training corpus of Ember's demo models.

Every document is either a conversation in the models' chat format (a user asks what a word means,
for a synonym, an opposite, a kind of thing, an example ...; the assistant answers from WordNet's
glosses and relations) or a paragraph of plain definitions. One synset in fifty is held out of
training and becomes the evaluation text for perplexity. The output is deterministic for a seed.

Usage: make_corpus.py WORDNET_DIR OUT_DIR [--seed N]
Writes OUT_DIR/train.jsonl (one {"text": ...} per document) and OUT_DIR/heldout.txt.
"""
import argparse
import json
import os
import random
import re
import zlib

USER, ASSISTANT, SYSTEM = "user", "assistant", "system"
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a helpful assistant that explains the meaning of English words.",
    "Answer briefly.",
    "You are Ember's small demo model.",
]
GREETINGS = [
    ("Hello!", "Hello! Ask me what an English word means, and I will explain it."),
    ("Hi", "Hi! I can explain English words. Which word would you like to know about?"),
    ("Hello, who are you?",
     "I am the small demo model of Ember, trained on the WordNet dictionary. Ask me what a word means."),
    ("Who are you?",
     "I am the small demo model of Ember, trained on the WordNet dictionary. Ask me what a word means."),
    ("What can you do?",
     "I can tell you what an English word means, give a synonym or an opposite, and use a word in a sentence."),
    ("Thank you!", "You are welcome! Ask me about another word any time."),
    ("Thanks.", "You are welcome."),
    ("Goodbye.", "Goodbye!"),
]


def render(messages):
    """The chat format (ChatML), as the chat template in tokenizer_config.json renders it."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def parse_data(path, pos):
    """data.POS -> {offset: synset}; a synset has words, definition, examples and pointers."""
    synsets = {}
    with open(path, encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):
                continue
            head, _, gloss = line.partition(" | ")
            fields = head.split()
            offset = fields[0]
            n_words = int(fields[3], 16)
            words = []
            for i in range(n_words):
                w = fields[4 + 2 * i]
                w = re.sub(r"\([a-z]+\)$", "", w).replace("_", " ")
                words.append(w)
            k = 4 + 2 * n_words
            n_ptrs = int(fields[k])
            ptrs = []
            for i in range(n_ptrs):
                sym, target, tpos, st = fields[k + 1 + 4 * i: k + 5 + 4 * i]
                ptrs.append((sym, target, "a" if tpos == "s" else tpos, int(st[:2], 16), int(st[2:], 16)))
            definition, examples = split_gloss(gloss.strip())
            synsets[offset] = {"pos": pos, "words": words, "def": definition, "examples": examples, "ptrs": ptrs}
    return synsets


def split_gloss(gloss):
    parts = [p.strip() for p in gloss.split(";")]
    defs, examples = [], []
    for p in parts:
        if p.startswith('"'):
            ex = p.strip('"').strip()
            if ex:
                examples.append(ex)
        elif not examples and p:
            defs.append(p)
    definition = "; ".join(defs)
    definition = re.sub(r"^\([^)]*\)\s*", "", definition)  # "(usually followed by `to') having ..."
    definition = definition.replace("`", "'").rstrip(".").strip()
    return definition, examples


def parse_index(path):
    """index.POS -> [(lemma, [offsets in sense order], tagged count)], most frequent senses first."""
    entries = []
    with open(path, encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):
                continue
            fields = line.split()
            lemma = fields[0].replace("_", " ")
            n_senses = int(fields[2])
            n_ptr = int(fields[3])
            tagged = int(fields[5 + n_ptr])
            offsets = fields[6 + n_ptr: 6 + n_ptr + n_senses]
            entries.append((lemma, offsets, tagged))
    return entries


def written_form(lemma, synset):
    """The index lowercases every lemma; the synset keeps "Indian grackle", "BTU", "Paris"."""
    for w in synset["words"]:
        if w.lower() == lemma:
            return w
    return lemma


def article(word):
    if word[:1].isupper() or word[:1].isdigit():
        return ""
    return "an " if word[0] in "aeiou" else "a "


DETERMINERS = ("a ", "an ", "any ", "one ", "the ", "some ", "either ", "each ", "(", "'")


def noun_article(word, definition):
    """ "A lizard is ...", but "Fitness is the quality of ..." and "Paris is ..." without one."""
    if definition.startswith(("the ", "(")) or definition.split(" ")[0].endswith("ing"):
        return ""
    return article(word)


def cap(s):
    return s[:1].upper() + s[1:]


def join_list(items):
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


class Builder:
    def __init__(self, db, rng):
        self.db, self.rng = db, rng

    def synset(self, pos, offset):
        return self.db[pos].get(offset)

    def related(self, s, symbols, limit=3):
        out = []
        for sym, target, tpos, _, dst in s["ptrs"]:
            if sym in symbols and target in self.db[tpos]:
                t = self.db[tpos][target]
                word = t["words"][dst - 1] if dst else t["words"][0]
                if word not in out:
                    out.append(word)
            if len(out) == limit:
                break
        return out

    def antonyms(self, s, word):
        out = []
        for sym, target, tpos, src, dst in s["ptrs"]:
            if sym == "!" and (src == 0 or s["words"][src - 1] == word) and target in self.db[tpos]:
                out.append(self.db[tpos][target]["words"][dst - 1 if dst else 0])
        return out

    def define(self, pos, w, s):
        d = s["def"]
        if pos == "n":
            a = noun_article(w, d)
            if a and not d.startswith(DETERMINERS):
                d = article(d) + d  # "a lizard is relatively long-bodied reptile" reads better with "a"
            return f"{cap(a)}{w} is {d}." if a else f"{cap(w)} is {d}."
        if pos == "v":
            return f"To {w} means to {d}."
        return f"{cap(w)} means {d}."

    def qa_pairs(self, pos, w, senses):
        """The questions one sense list answers, as (question, answer) pairs."""
        r, s = self.rng, senses[0]
        a = noun_article(w, s["def"]) if pos == "n" else ""
        pairs = []
        if pos == "n":
            q = r.choice([f"What is {a}{w}?", f"What is {a}{w}?", f"What's {a}{w}?", f"what is {a}{w}",
                          f"Define {w}.", f"What does {w} mean?", f'What does the word "{w}" mean?',
                          f"Tell me what {a}{w} is.", f"Explain what {a}{w} is.", f"{cap(w)}?"])
        elif pos == "v":
            q = r.choice([f"What does it mean to {w}?", f"What does {w} mean?", f"Define the verb {w}.",
                          f'What does the verb "{w}" mean?', f"What is the meaning of {w}?"])
        else:
            q = r.choice([f"What does {w} mean?", f'What does the word "{w}" mean?', f"Define {w}.",
                          f"What is the meaning of {w}?", f"What does it mean to be {w}?"])
        pairs.append((q, self.define(pos, w, s)))
        if s["examples"] and r.random() < 0.5:
            ex = cap(r.choice(s["examples"]).rstrip(".!?"))
            pairs.append((r.choice([f"Use {w} in a sentence.", f'Use the word "{w}" in a sentence.',
                                    f"Can you give an example with {w}?"]), f'Here is an example: "{ex}."'))
        synonyms = [x for x in s["words"] if x.lower() != w.lower()]
        if synonyms and r.random() < 0.5:
            pairs.append((r.choice([f"What is another word for {w}?", f"Give me a synonym for {w}.",
                                    f"What is a synonym of {w}?"]), f'Another word for {w} is "{synonyms[0]}".'))
        hyper = self.related(s, {"@", "@i"}, 1)
        if hyper and pos in "nv" and r.random() < 0.5:
            if pos == "n":
                pairs.append((f"What kind of thing is {a}{w}?", f"{cap(a)}{w} is a kind of {hyper[0]}."
                              if a else f"{cap(w)} is a kind of {hyper[0]}."))
            else:
                pairs.append((f"What kind of action is to {w}?", f"To {w} is a way to {hyper[0]}."))
        hypo = self.related(s, {"~", "~i"}, 3)
        if hypo and pos == "n" and r.random() < 0.4:
            pairs.append((r.choice([f"Name some kinds of {w}.", f"What are some types of {w}?"]),
                          f"Some kinds of {w} are {join_list(hypo)}."))
        parts = self.related(s, {"%p"}, 3)
        if parts and r.random() < 0.5:
            pairs.append((f"What are the parts of {a}{w}?", f"The parts of {a}{w} include {join_list(parts)}."))
        ants = self.antonyms(s, w)
        if ants and r.random() < 0.7:
            pairs.append((r.choice([f"What is the opposite of {w}?", f"What is an antonym of {w}?"]),
                          f"The opposite of {w} is {ants[0]}."))
        if len(senses) > 1 and r.random() < 0.4:
            n = min(3, len(senses))
            lines = " ".join(f"{i + 1}. {cap(x['def'])}." for i, x in enumerate(senses[:n]))
            pairs.append((r.choice([f"What are the meanings of {w}?", f'What can "{w}" mean?']),
                          f'The word "{w}" has {"several" if len(senses) > 3 else len(senses)} meanings. {lines}'))
        return pairs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("wordnet")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="passes over the vocabulary, each with new phrasings")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    names = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
    db = {p: parse_data(os.path.join(args.wordnet, f"data.{n}"), p) for p, n in names.items()}
    index = {p: parse_index(os.path.join(args.wordnet, f"index.{n}")) for p, n in names.items()}

    def held_out(offset):
        return zlib.crc32(offset.encode()) % 50 == 0

    b = Builder(db, rng)
    items = []  # (pos, lemma, senses, weight)
    for pos, entries in index.items():
        for lemma, offsets, tagged in entries:
            senses = [db[pos][o] for o in offsets if o in db[pos] and db[pos][o]["def"]]
            if not senses or held_out(offsets[0]) or len(lemma) > 30:
                continue
            lemma = written_form(lemma, senses[0])
            weight = 4 if tagged > 0 else 1
            items.append((pos, lemma, senses, weight))
    os.makedirs(args.out, exist_ok=True)
    n_docs = 0
    with open(os.path.join(args.out, "train.jsonl"), "w") as out:
        for _ in range(args.rounds):
            pool = [it for it in items for _ in range(it[3])]
            rng.shuffle(pool)
            i = 0
            while i < len(pool):
                kind = rng.random()
                if kind < 0.15:  # a paragraph of plain definitions
                    take = pool[i: i + rng.randint(4, 10)]
                    text = " ".join(b.define(p, w, s[0]) for p, w, s, _ in take)
                    i += len(take)
                else:
                    messages = []
                    if rng.random() < 0.15:
                        messages.append({"role": SYSTEM, "content": rng.choice(SYSTEM_PROMPTS)})
                    if rng.random() < 0.03:
                        q, a = rng.choice(GREETINGS)
                        messages += [{"role": USER, "content": q}, {"role": ASSISTANT, "content": a}]
                    for p, w, s, _ in pool[i: i + rng.choice([1, 1, 1, 2, 3])]:
                        pairs = b.qa_pairs(p, w, s)
                        for q, a in pairs[: rng.randint(1, len(pairs))]:
                            messages += [{"role": USER, "content": q}, {"role": ASSISTANT, "content": a}]
                        i += 1
                    if rng.random() < 0.02:
                        q, a = rng.choice(GREETINGS[-3:])
                        messages += [{"role": USER, "content": q}, {"role": ASSISTANT, "content": a}]
                    text = render(messages)
                out.write(json.dumps({"text": text}) + "\n")
                n_docs += 1
    held = []
    for pos, entries in index.items():
        for lemma, offsets, _ in entries:
            s = db[pos].get(offsets[0])
            if s and s["def"] and held_out(offsets[0]) and len(lemma) <= 30:
                held.append(b.define(pos, written_form(lemma, s), s))
    rng.shuffle(held)
    with open(os.path.join(args.out, "heldout.txt"), "w") as f:
        for k in range(0, len(held), 8):
            f.write(" ".join(held[k: k + 8]) + "\n")
    print(f"{n_docs} training documents, {len(items)} words; {len(held)} held-out definitions")


if __name__ == "__main__":
    main()

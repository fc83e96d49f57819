"""Grammar-constrained generation end to end on the default model: `tern run
--grammar`, `--grammar-file` and `--json-schema` over many seeds and
temperatures, every output checked by an independent judge (Python's re for
grammars written as regular expressions, the jsonschema package for
schemas), and bad grammars and schemas refused with a message naming what
is wrong."""

import json
import os
import random
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest

SOURCE = Path(os.environ.get("TERN_SOURCE", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("TERN_BUILD", SOURCE / "build"))
TERN = BUILD / "tern"
MODEL = Path(os.environ.get("TERN_MODEL", SOURCE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
TIMEOUT = 120

SEED = random.SystemRandom().randrange(1 << 32)
RNG = random.Random(SEED)


@pytest.fixture(autouse=True)
def _print_seed():
    print(f"test_structured_output random seed: {SEED}")


def run(*args):
    if not TERN.exists() or not MODEL.exists():
        pytest.fail(f"{TERN} or {MODEL} missing: run scripts/setup")
    return subprocess.run([str(TERN), "run", "-m", str(MODEL), "-t", "1", *map(str, args)], capture_output=True,
                          text=True, timeout=TIMEOUT)


def seeds(n):
    return [RNG.randrange(1 << 31) for _ in range(n)]


# Grammars whose language is exactly that of a regular expression, each
# sentence shorter than the token limit (so every answer must be whole).
REGULAR = [
    ('root ::= ("yes" | "no") "." | [0-9]{1,3} " " ("cats" | "dogs")', r"(yes|no)\.|[0-9]{1,3} (cats|dogs)"),
    ('root ::= item{1,3}\nitem ::= "- " [a-z ]{1,12} "\\n"', r"(- [a-z ]{1,12}\n){1,3}"),
    ('root ::= [A-Z] [a-z]{1,9} (", " [A-Z] [a-z]{1,9}){0,2} "!"', r"[A-Z][a-z]{1,9}(, [A-Z][a-z]{1,9}){0,2}!"),
]


@pytest.mark.parametrize("gbnf,regex", REGULAR)
def test_output_always_matches_its_grammar(gbnf, regex):
    for seed, temp in zip(seeds(6), [0, 0.7, 1.0, 1.5, 0.7, 1.0]):
        r = run("--chat", "-p", "Name some animals.", "--grammar", gbnf, "-n", "64", "--temp", temp,
                "--seed", seed)
        assert r.returncode == 0, r.stderr
        out = r.stdout[:-1] if r.stdout.endswith("\n") and not re.fullmatch(regex, r.stdout) else r.stdout
        assert re.fullmatch(regex, out), f"seed {seed} temp {temp}: {out!r}"


CAT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "color": {"enum": ["black", "white", "ginger", "grey"]},
        "toys": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
        "born": {"type": "string", "format": "date"},
        "owner": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"name": {"type": "string",
                                                                                          "maxLength": 24}},
                                                "required": ["name"], "additionalProperties": False}]},
    },
    "required": ["name", "age", "color"],
    "additionalProperties": False,
}


def test_json_schema_output_always_validates(tmp_path):
    schema = tmp_path / "cat.json"
    schema.write_text(json.dumps(CAT))
    checker = jsonschema.Draft202012Validator(CAT, format_checker=jsonschema.FormatChecker())
    for seed, temp in zip(seeds(6), [0, 0.9] * 3):
        r = run("--chat", "-p", "Describe a cat as JSON.", "--json-schema", schema, "-n", "300", "--temp", temp,
                "--seed", seed, "-v")
        assert r.returncode == 0, r.stderr
        # Every string is bounded, so the answer ends by the grammar, not the token limit.
        assert "finish reason: stop" in r.stderr, f"seed {seed} temp {temp}: {r.stdout!r}"
        doc = json.loads(r.stdout)
        errors = list(checker.iter_errors(doc))
        assert not errors, f"seed {seed} temp {temp}: {r.stdout!r}: {errors[0].message}"


def test_grammar_file_and_the_grammar_ending_the_answer(tmp_path):
    g = tmp_path / "answer.gbnf"
    g.write_text('# an answer and nothing after it\nroot ::= "The answer is " [0-9]+ "."\n')
    r = run("-p", "What is 6 times 7?", "--grammar-file", g, "-n", "40", "--temp", "0", "-v")
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"The answer is [0-9]+\.\n?", r.stdout), r.stdout
    assert "finish reason: stop" in r.stderr  # the grammar was complete: no token limit reached


@pytest.mark.parametrize("args,says", [
    (["--grammar", "root ::= answer"], "rule 'answer' is used but not defined"),
    (["--grammar", "root ::= root \"a\""], "left-recursive"),
    (["--grammar", "root ::= \"a\"", "--grammar-file", "x.gbnf"], "give one of"),
])
def test_bad_grammars_are_refused_by_name(args, says):
    r = run("-p", "Hi", "-n", "4", *args)
    assert r.returncode == 1
    assert says in r.stderr, r.stderr


def test_bad_schemas_are_refused_by_name(tmp_path):
    for schema, says in [({"type": "string", "pattern": "^a"}, "'pattern' is not supported (at $)"),
                         ({"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}},
                          "'maximum' is not supported (at $.properties.n)")]:
        f = tmp_path / "s.json"
        f.write_text(json.dumps(schema))
        r = run("-p", "Hi", "-n", "4", "--json-schema", f)
        assert r.returncode == 1
        assert says in r.stderr, r.stderr
    f.write_text("{not json")
    r = run("-p", "Hi", "-n", "4", "--json-schema", f)
    assert r.returncode == 1 and "not valid JSON" in r.stderr, r.stderr

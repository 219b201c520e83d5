#!/usr/bin/env python3
"""make_tokenizer_vectors.py — dev-time generator of the GPT-2 tokenizer test vectors.

Writes, from tiktoken's `gpt2` encoding built offline from the local GPT-2 files:
  tests/vectors/tokenizer/hard_strings.json    hard inputs (unicode, emoji, whitespace runs,
                                            contractions, digits, invalid UTF-8, fuzz) + ids
  tests/vectors/tokenizer/tinyshakespeare.json token count, FNV-1a-64 hashes, first/last 1000 ids

Invalid UTF-8: tiktoken encodes str, so the expected ids are those of
bytes.decode("utf-8", errors="replace") — the rule dion's tokenizer implements.

With --check DION_DATA (the built dion-data tool) it instead compares our tokenizer with
tiktoken: every case above, plus a sweep over every Unicode code point (each in a few contexts),
and prints the code points where the two disagree (expected only for characters newer than the
Unicode version of the system's PCRE2).

Not used by the tests (they read the committed JSON); needs `pip install tiktoken`.
Usage:
  python3 scripts/make_tokenizer_vectors.py [--tokenizer data/gpt2]
  python3 scripts/make_tokenizer_vectors.py --check build/dion-data
"""
import argparse
import json
import os
import random
import subprocess
import sys

import tiktoken
import tiktoken.load

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"


def gpt2_encoding(gpt2_dir):
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=os.path.join(gpt2_dir, "vocab.bpe"),
        encoder_json_file=os.path.join(gpt2_dir, "encoder.json"),
    )
    return tiktoken.Encoding(
        "gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks, special_tokens={EOT: 50256},
        explicit_n_vocab=50257,
    )


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def ids_bytes(ids):
    return b"".join(i.to_bytes(4, "little") for i in ids)


# ---------------------------------------------------------------------------- cases

def hard_cases():
    """(name, bytes, special) — special: read "<|endoftext|>" as token 50256."""
    s = lambda name, text, special=False: (name, text.encode("utf-8"), special)
    b = lambda name, data: (name, data, False)
    cases = [
        s("empty", ""),
        s("space", " "),
        s("hello", "Hello world"),
        s("contractions", "I'm you're they've he'll she'd it's don't we'D I'LL 'S"),
        s("contraction_runs", "''s '''t rock'n'roll o'clock y'all"),
        s("digits", "0 1 12 123 1234 12345 3.14159 1,000,000 2024-05-20 0x1F"),
        s("digits_other_scripts", "٣٤٥ ०१२ ½ ² Ⅻ ⅷ 𝟙𝟚"),
        s("spaces_runs", "a  b   c    d     e"),
        s("trailing_spaces", "end   "),
        s("leading_spaces", "   start"),
        s("tabs_newlines", "\tx\t\ty\n\nz\r\n\r\nw \n \n"),
        s("only_newlines", "\n\n\n\n"),
        s("whitespace_mix", " \t \n\u00a0\u3000x\u2028y\u0085z\u180ew\u200bv\u202f"),
        s("space_before_punct", "a !b ?? c... d—e – f"),
        s("punct_runs", "!!!??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}"),
        s("latin_accents", "héllo wörld naïve café résumé Ångström façade"),
        s("combining", "e\u0301 a\u0308 n\u0303\u0303 \u0301alone"),
        s("cjk", "日本語のテキストです。中文文本。한국어 텍스트"),
        s("cyrillic_greek", "Привет мир! Γειά σου Κόσμε"),
        s("arabic_hebrew", "مرحبا بالعالم שלום עולם"),
        s("indic", "नमस्ते दुनिया வணக்கம்"),
        s("emoji", "🙂👍🏽👨‍👩‍👧‍👦 🇫🇷 ❤️ 🏳️‍🌈 x🙂y"),
        s("symbols", "€ £ ¥ © ® ™ ° ± × ÷ ∞ ≠ ≤ ≥ → ← ↔ ∑ ∫ √"),
        s("ligature_fullwidth", "ﬁ ﬂ Ｈｅｌｌｏ　ｗｏｒｌｄ １２３"),
        s("zero_width", "a\u200db\u200cc\ufeffd\u2060e"),
        s("control_chars", "a\x00b\x01c\x1fd\x7fe"),
        s("eot_as_text", "a<|endoftext|>b <|endoftext|> c"),
        s("eot_special", "a<|endoftext|>b <|endoftext|> c<|endoftext|>", True),
        s("eot_special_only", "<|endoftext|>", True),
        s("code", "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n"),
        s("url_email", "https://example.com/a?b=c&d=e#f user@example.org"),
        s("json", '{"a": [1, 2.5, null], "b": "c\\nd"}'),
        s("long_word", "a" * 3000),
        s("long_spaces", " " * 5000 + "x"),
        s("long_newlines", "\n" * 3000),
        s("long_digits", "9" * 2000),
        s("long_punct", "!" * 2000),
        s("long_emoji", "🙂" * 500),
        s("repeated_pairs", "abababababababababababababababab aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
        s("mixed_case", "HELLO hello HeLLo hELLO"),
        s("nbsp_words", "a\u00a0b \u00a0c\u00a0 d"),
        s("private_use", "\ue000\uf8ff\U000f0000"),
        s("noncharacters", "\ufffe\uffff\U0010ffff"),
        s("replacement_char", "\ufffd a\ufffdb"),
        b("invalid_ff", b"\xff"),
        b("invalid_lone_continuation", b"abc\x80def"),
        b("invalid_truncated_3byte", b"x\xe2\x82"),
        b("invalid_truncated_3byte_mid", b"x\xe2\x82y"),
        b("invalid_truncated_4byte", b"\xf0\x9f\x98 end"),
        b("invalid_surrogate", b"\xed\xa0\x80z"),
        b("invalid_overlong", b"\xc0\xaf\xe0\x80\xaf"),
        b("invalid_above_max", b"\xf4\x90\x80\x80!"),
        b("invalid_f5_ff", b"\xf5\xf8\xfc\xfe\xff"),
        b("invalid_many_continuations", b"\x80\x81\x82\xbf"),
        b("invalid_mixed", b"caf\xe9 na\xefve \xc3\xa9 ok \xe2\x28\xa1"),
        b("invalid_space_prefix", b" \xff \xfe\xfd x"),
        b("latin1_text", "Grüße aus Köln, señor".encode("latin-1")),
        b("nul_bytes", b"\x00\x00a\x00"),
    ]
    return cases


def fuzz_cases(seed=20240520):
    rng = random.Random(seed)
    pool = (list("abcdefXYZ'sdmtlvre0123456789 ") * 3 + [" ", " ", "  ", "\t", "\n", "\r\n"] +
            list(".,;:!?-_'\"()[]{}<>/\\|@#$%^&*+=~`") +
            list("éüñçØßÆ") + list("日本語中文한") + ["🙂", "👍🏽", "\u200d", "\u0301", "\u00a0",
                                                   "\u3000", "\u2028", "\u0085", "٣", "½", "Ⅻ",
                                                   "\ufffd", "\x00"])
    out = []
    for i in range(300):
        n = rng.randint(1, 40)
        out.append((f"fuzz_text_{i:03d}", "".join(rng.choice(pool) for _ in range(n)).encode(), False))
    for i in range(60):
        n = rng.randint(1, 24)
        out.append((f"fuzz_bytes_{i:02d}", bytes(rng.randrange(256) for _ in range(n)), False))
    return out


def expected_ids(enc, data: bytes, special: bool):
    text = data.decode("utf-8", errors="replace")
    return enc.encode(text, allowed_special="all") if special else enc.encode_ordinary(text)


# ---------------------------------------------------------------------------- generate

def generate(enc, args):
    out_dir = os.path.join(REPO, "tests", "vectors", "tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    cases = []
    for name, data, special in hard_cases() + fuzz_cases():
        cases.append({"name": name, "input_hex": data.hex(), "special": special,
                      "ids": expected_ids(enc, data, special)})
    with open(os.path.join(out_dir, "hard_strings.json"), "w") as f:
        json.dump({"generator": "scripts/make_tokenizer_vectors.py",
                   "tiktoken": tiktoken.__version__,
                   "invalid_utf8": "ids of bytes.decode('utf-8', errors='replace')",
                   "cases": cases}, f, separators=(",", ":"))
        f.write("\n")

    with open(args.shakespeare, "rb") as f:
        raw = f.read()
    ids = enc.encode_ordinary(raw.decode("utf-8", errors="replace"))
    n = 1000
    with open(os.path.join(out_dir, "tinyshakespeare.json"), "w") as f:
        json.dump({"generator": "scripts/make_tokenizer_vectors.py",
                   "tiktoken": tiktoken.__version__,
                   "input": "data/tinyshakespeare/input.txt",
                   "input_bytes": len(raw),
                   "input_fnv1a64": f"{fnv1a64(raw):016x}",
                   "tokens": len(ids),
                   "ids_fnv1a64": f"{fnv1a64(ids_bytes(ids)):016x}",
                   "ids_fnv1a64_note": "FNV-1a 64 over the ids as uint32 little-endian",
                   "head": ids[:n], "tail": ids[-n:]}, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases and Tiny Shakespeare ({len(ids)} tokens) to {out_dir}")


# ---------------------------------------------------------------------------- check

def ours(binary, gpt2_dir, data: bytes, special=False):
    cmd = [binary, "encode", "--tokenizer", gpt2_dir, "-"] + (["--special"] if special else [])
    r = subprocess.run(cmd, input=data, capture_output=True, check=True)
    return [int(x) for x in r.stdout.split()]


def check(enc, args):
    bad = 0
    for name, data, special in hard_cases() + fuzz_cases():
        if ours(args.check, args.gpt2_dir, data, special) != expected_ids(enc, data, special):
            print(f"MISMATCH {name}: {data!r}")
            bad += 1
    print(f"cases: {bad} mismatches")
    # Every code point in a few contexts, separated by <|endoftext|>.
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    chunks = [f"x{chr(c)} {chr(c)}1{chr(c)}{chr(c)} '{chr(c)}\n{chr(c)}" for c in cps]
    text = EOT.join(chunks)
    theirs = enc.encode(text, allowed_special="all")
    mine = ours(args.check, args.gpt2_dir, text.encode(), special=True)

    def split(ids):
        out, cur = [], []
        for i in ids:
            if i == 50256:
                out.append(cur)
                cur = []
            else:
                cur.append(i)
        out.append(cur)
        return out

    a, b = split(theirs), split(mine)
    assert len(a) == len(b) == len(cps), (len(a), len(b), len(cps))
    diff = [cps[i] for i in range(len(cps)) if a[i] != b[i]]
    ranges = []
    for c in diff:
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    print(f"unicode sweep: {len(diff)} of {len(cps)} code points differ")
    for lo, hi in ranges:
        print(f"  U+{lo:04X}" + (f"..U+{hi:04X}" if hi != lo else ""))
    return 1 if bad else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", dest="gpt2_dir", default=os.path.join(REPO, "data", "gpt2"),
                   help="folder with the GPT-2 files encoder.json and vocab.bpe (as dion-data --tokenizer)")
    p.add_argument("--shakespeare",
                   default=os.path.join(REPO, "data", "tinyshakespeare", "input.txt"))
    p.add_argument("--check", metavar="DION_DATA", help="compare the built dion-data with tiktoken")
    args = p.parse_args()
    enc = gpt2_encoding(args.gpt2_dir)
    sys.exit(check(enc, args) if args.check else generate(enc, args))


if __name__ == "__main__":
    main()

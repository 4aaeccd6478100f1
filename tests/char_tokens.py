"""A character tokenizer for the tests of sources that write text through the policy: token k is
character k, id 0 is both end of sequence and padding (the tests' stand-in policies emit ids)."""


class CharTokenizer:
    eos_token_id, pad_token_id = 0, 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i)


def char_ids(s: str) -> list[int]:
    return [ord(c) for c in s]


def char_text(ids) -> str:
    return "".join(chr(i) for i in ids if i)

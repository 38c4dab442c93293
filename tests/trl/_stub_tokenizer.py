"""A word-level stub tokenizer (one id per whitespace word) for exact layout tests; ``<s>``=1, ``</s>``=2."""


class WordTokenizer:
    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0
    eos_token = "</s>"
    chat_template = None

    def __init__(self):
        self.vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}

    def _id(self, w):
        return self.vocab.setdefault(w, len(self.vocab))

    def encode(self, text, add_special_tokens=True):
        ids = [self._id(w) for w in text.split()]
        return ([self.bos_token_id] if add_special_tokens else []) + ids

    def words(self, ids):
        inv = {v: k for k, v in self.vocab.items()}
        return [inv[i] if i >= 0 else "-" for i in ids]


class ChatWordTokenizer(WordTokenizer):
    """Adds a tiny ChatML-like template: ``<u> text </t>`` per user turn, ``<a> text </t>`` per answer."""

    eos_token = "</t>"
    chat_template = "stub"

    def __init__(self):
        super().__init__()
        self.eos_token_id = self._id("</t>")

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        out = "<sys> "
        for m in messages:
            out += ("<u> " if m["role"] == "user" else "<a> ") + m["content"] + " </t> \n "
        if add_generation_prompt:
            out += "<a> "
        return out

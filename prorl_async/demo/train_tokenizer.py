"""Train the bundled demo tokenizer (``prorl_async/assets/tokenizer/``), reproducibly.

Run ``python -m prorl_async.demo.train_tokenizer [OUT_DIR]``. The corpus is generated here from a
fixed seed (English-like prose, maths, JSON, Python, shell and ChatML conversations with tool
calls rendered through the bundled chat template) plus this file's own source; nothing is
downloaded, so the same script and ``tokenizers`` version give byte-identical files.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from prorl_async.llm.chat_template import ChatTemplate

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "VOCAB_SIZE", "build_corpus", "train", "main"]

VOCAB_SIZE = 6144
SEED = 20240611
# ChatML turn markers are special (skipped by ``skip_special_tokens``); the Hermes tool tags are
# added but not special, as in Qwen2.5/Qwen3, so engines' detokenized text still shows them.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
# Qwen2's pre-tokenizer split: digits one by one, letters in runs, punctuation runs, newlines.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML with Hermes/Qwen2.5-style tool calls: tools are listed in the system prompt, tool
# results are wrapped in <tool_response> inside a user turn.
CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \
\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) \
or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

README = """\
# Bundled demo tokenizer

A small byte-level BPE tokenizer (vocab {vocab}) with a ChatML chat template and Hermes/Qwen-style
tool calls. It exists so that demos and tests can run token-in/token-out rollouts without
downloading anything. **It is a demo tokenizer, not for real training**: point the server at
your model's own tokenizer directory for that.

- Trained by `python -m prorl_async.demo.train_tokenizer` on text that script generates from a fixed
  seed (English-like prose, maths, JSON, Python, shell, tool-call conversations) plus its own
  source. Deterministic: re-running it with `tokenizers` {version} (the version these files
  were made with) reproduces them byte for byte.
- Special tokens (single ids, never merged): `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`
  (`special: true`) and `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>`
  (added tokens, `special: false` as in Qwen2.5/Qwen3 so detokenized text keeps them).
- `eos_token` is `<|im_end|>` (end of turn); `pad_token` is `<|endoftext|>`.
- The chat template is in `tokenizer_config.json` (`chat_template`): tools are listed in the
  system prompt, assistant tool calls render as `<tool_call>{{"name": ..., "arguments": ...}}
  </tool_call>`, and `tool` messages are wrapped in `<tool_response>` inside a user turn.
"""

# About a thousand common English words plus some technical ones: enough for a realistic vocab.
_WORDS = """
the of and to in is it you that he was for on are with as his they be at one have this from or
had by not word but what some we can out other were all there when up use your how said an each
she which do their time if will way about many then them write would like so these her long make
thing see him two has look more day could go come did number sound no most people my over know
water than call first who may down side been now find any new work part take get place made live
where after back little only round man year came show every good me give our under name very
through just form sentence great think say help low line differ turn cause much mean before move
right boy old too same tell does set three want air well also play small end put home read hand
port large spell add even land here must big high such follow act why ask men change went light
kind off need house picture try us again animal point mother world near build self earth father
head stand own page should country found answer school grow study still learn plant cover food
sun four between state keep eye never last let thought city tree cross farm hard start might
story saw far sea draw left late run while press close night real life few north open seem
together next white children begin got walk example ease paper group always music those both
mark often letter until mile river car feet care second book carry took science eat room friend
began idea fish mountain stop once base hear horse cut sure watch color face wood main enough
plain girl usual young ready above ever red list though feel talk bird soon body dog family
direct pose leave song measure door product black short numeral class wind question happen
complete ship area half rock order fire south problem piece told knew pass since top whole king
space heard best hour better true during hundred five remember step early hold west ground
interest reach fast verb sing listen six table travel less morning ten simple several vowel
toward war lay against pattern slow center love person money serve appear road map rain rule
govern pull cold notice voice unit power town fine certain fly fall lead cry dark machine note
wait plan figure star box noun field rest correct able pound done beauty drive stood contain
front teach week final gave green quick develop ocean warm free minute strong special mind
behind clear tail produce fact street inch multiply nothing course stay wheel full force blue
object decide surface deep moon island foot system busy test record boat common gold possible
plane stead dry wonder laugh thousand ago ran check game shape equate miss brought heat snow
tire bring yes distant fill east paint language among grand ball yet wave drop heart present
heavy dance engine position arm wide sail material size vary settle speak weight general ice
matter circle pair include divide syllable felt perhaps pick sudden count square reason length
represent art subject region energy hunt probable bed brother egg ride cell believe fraction
forest sit race window store summer train sleep prove lone leg exercise wall catch mount wish
sky board joy winter sat written wild instrument kept glass grass cow job edge sign visit past
soft fun bright gas weather month million bear finish happy hope flower clothe strange gone jump
baby eight village meet root buy raise solve metal whether push seven paragraph third shall held
hair describe cook floor either result burn hill safe cat century consider type law bit coast
copy phrase silent tall sand soil roll temperature finger industry value fight lie beat excite
natural view sense ear else quite broke case middle kill son lake moment scale loud spring
observe child straight consonant nation dictionary milk speed method organ pay age section dress
cloud surprise quiet stone tiny climb cool design poor lot experiment bottom key iron single
stick flat twenty skin smile crease hole trade melody trip office receive row mouth exact symbol
die least trouble shout except wrote seed tone join suggest clean break lady yard rise bad blow
oil blood touch grew cent mix team wire cost lost brown wear garden equal sent choose fell fit
flow fair bank collect save control decimal gentle woman captain practice separate difficult
doctor please protect noon whose locate ring character insect caught period indicate radio spoke
atom human history effect electric expect crop modern element hit student corner party supply
bone rail imagine provide agree thus capital chair danger fruit rich thick soldier process
operate guess necessary sharp wing create neighbor wash bat rather crowd corn compare poem
string bell depend meat rub tube famous dollar stream fear sight thin triangle planet hurry
chief colony clock mine tie enter major fresh search send yellow gun allow print dead spot
desert suit current lift rose continue block chart hat sell success company subtract event
particular deal swim term opposite wife shoe shoulder spread arrange camp invent cotton born
determine quart nine truck noise level chance gather shop stretch throw shine property column
molecule select wrong gray repeat require broad prepare salt nose plural anger claim continent
oxygen sugar death pretty skill women season solution magnet silver thank branch match suffix
especially fig afraid huge sister steel discuss forward similar guide experience score apple
bought led pitch coat mass card band rope slip win dream evening condition feed tool total basic
smell valley nor double seat arrive master track parent shore division sheet substance favor
connect post spend chord fat glad original share station dad bread charge proper bar offer
segment duck instant market degree populate chick dear enemy reply drink occur support speech
nature range steam motion path liquid log meant quotient teeth shell neck agent model server
sandbox token reward policy task kernel request buffer trajectory message backend queue worker
matrix vector graph integer float boolean array module package import return async await lambda
yield def finally assert global error exception timeout cancel config parse render template
encode decode compile execute install commit merge deploy container network socket thread lock
""".split()
_NOUNS = (
    "agent model server tool sandbox token reward policy task answer problem number function "
    "file process kernel shell request result buffer trajectory turn message engine backend "
    "queue worker job value table river city garden teacher student book window question"
).split()
_VERBS = "runs returns computes reads writes sends checks parses builds solves finds counts".split()
_ADJS = "small large fast slow new old simple correct wrong empty full first last next".split()
_TOOLS = [
    ("bash", "command", ["ls -la", "cat README.md", "python3 main.py", "grep -rn TODO .", "pwd"]),
    ("python", "code", ["print(2 + 2)", "import math\nprint(math.sqrt(17))", "x = [1, 2, 3]"]),
    ("search", "query", ["capital of France", "prime numbers below 100", "asyncio timeout"]),
    ("read_file", "path", ["src/app.py", "/tmp/data.json", "tests/test_main.py"]),
]


def _sentence(rng: random.Random) -> str:
    words = rng.choices(_WORDS, k=rng.randint(4, 14))
    if rng.random() < 0.3:
        words[rng.randrange(len(words))] = rng.choice(_WORDS).capitalize()
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words)), str(rng.randint(0, 2030)))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice([".", ".", ".", "!", "?", ";", ",", ":"])


def _prose(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randint(2, 8)))


def _identifier(rng: random.Random) -> str:
    parts = rng.choices(_WORDS, k=rng.randint(1, 3))
    style = rng.randint(0, 2)
    if style == 0:
        return "_".join(parts)
    if style == 1:
        return parts[0] + "".join(p.capitalize() for p in parts[1:])
    return "".join(p.capitalize() for p in parts)


def _maths(rng: random.Random) -> str:
    a, b, c = rng.randint(1, 999), rng.randint(1, 99), rng.randint(-50, 50)
    forms = [
        f"Solve for x: {b}x + {c} = {a}. Subtract {c} from both sides, then divide by {b}.",
        f"What is {a} * {b}? The answer is {a * b}.",
        f"Compute {a} + {b} - {c} = {a + b - c}.",
        f"Let f(x) = {b}x^2 - {c}x + {a}. Then f(2) = {4 * b - 2 * c + a}.",
        f"\\frac{{{a}}}{{{b}}} \\approx {a / b:.4f}, so the answer is \\boxed{{{a // b}}}.",
        f"The sum of the first {b} integers is {b * (b + 1) // 2}.",
    ]
    return rng.choice(forms)


def _json_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randint(0, 5 if depth < 2 else 3)
    if kind == 0:
        return rng.randint(-1000, 100000)
    if kind == 1:
        return round(rng.uniform(-10, 10), 3)
    if kind == 2:
        return " ".join(rng.choices(_WORDS, k=rng.randint(1, 4)))
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {_identifier(rng): _json_value(rng, depth + 1) for _ in range(rng.randint(1, 4))}


def _python(rng: random.Random) -> str:
    name, arg = _identifier(rng), rng.choice(_WORDS)
    body = rng.choice(
        [
            f"    return [{arg} * 2 for {arg} in range({rng.randint(1, 100)})]",
            f"    if {arg} is None:\n        raise ValueError('{arg} is required')\n"
            f"    return {arg}",
            f"    async with asyncio.timeout({rng.randint(1, 60)}):\n"
            f"        return await {arg}.read()",
            f"    total = 0\n    for i, item in enumerate({arg}):\n        total += i\n"
            "    return total",
        ]
    )
    return f'def {name}({arg}: int) -> int:\n    """{_sentence(rng)}"""\n{body}\n'


def _tool_spec(name: str, arg: str) -> dict[str, object]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Run the {name} tool.",
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string", "description": f"The {arg}."}},
                "required": [arg],
            },
        },
    }


def _conversation(rng: random.Random) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    tools = [_tool_spec(n, a) for n, a, _ in rng.sample(_TOOLS, rng.randint(0, 3))]
    msgs: list[dict[str, object]] = [
        {"role": "system", "content": "You are a careful agent. " + _sentence(rng)},
        {"role": "user", "content": rng.choice([_maths(rng), _prose(rng)])},
    ]
    for _ in range(rng.randint(1, 3)):
        name, arg, values = rng.choice(_TOOLS)
        call = {"name": name, "arguments": {arg: rng.choice(values)}}
        msgs.append({"role": "assistant", "content": _sentence(rng), "tool_calls": [call]})
        msgs.append({"role": "tool", "content": json.dumps(_json_value(rng))})
    msgs.append({"role": "assistant", "content": "The answer is " + str(rng.randint(0, 999))})
    return msgs, tools


def _render_conversations(rng: random.Random, count: int) -> Iterator[str]:
    template = ChatTemplate(CHAT_TEMPLATE)
    for _ in range(count):
        msgs, tools = _conversation(rng)
        yield template.render(msgs, tools=tools or None, add_generation_prompt=False)


def build_corpus(seed: int = SEED) -> Iterator[str]:
    """Yield the training documents, deterministically for a given seed."""
    rng = random.Random(seed)
    yield Path(__file__).read_text(encoding="utf-8")
    for _ in range(6000):
        yield _prose(rng)
        yield _maths(rng)
        yield json.dumps(_json_value(rng), indent=rng.choice([None, 2]))
    for _ in range(2000):
        yield _python(rng)
        yield "$ " + rng.choice(_TOOLS[0][2]) + "\n" + _prose(rng)
    yield from _render_conversations(rng, 3000)


def train(seed: int = SEED) -> Tokenizer:
    """Train the byte-level BPE and register the chat special tokens."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS + TOOL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(build_corpus(seed), trainer=trainer)
    return _mark_tool_tokens_not_special(tok)


def _mark_tool_tokens_not_special(tok: Tokenizer) -> Tokenizer:
    data = json.loads(tok.to_str())
    for entry in data["added_tokens"]:
        entry["special"] = entry["content"] in SPECIAL_TOKENS
        entry["normalized"] = False
    return Tokenizer.from_str(json.dumps(data))


def tokenizer_config() -> dict[str, object]:
    """The ``tokenizer_config.json`` written next to ``tokenizer.json``."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 32768,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }


def main(argv: list[str] | None = None) -> None:
    """Train and write the tokenizer directory (default: the bundled assets folder)."""
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else Path(__file__).parents[1] / "assets" / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    tok = train()
    (out / "tokenizer.json").write_text(tok.to_str(pretty=False) + "\n", encoding="utf-8")
    config = json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n"
    (out / "tokenizer_config.json").write_text(config, encoding="utf-8")
    (out / "README.md").write_text(
        README.format(vocab=tok.get_vocab_size(), version=tokenizers.__version__), encoding="utf-8"
    )


if __name__ == "__main__":
    main()

"""`tern template` against Python's jinja2 configured as Hugging Face
transformers configures it (an ImmutableSandboxedEnvironment with trim_blocks
and lstrip_blocks, the loopcontrols extension, a generation tag, and the
raise_exception / strftime_now globals and the tojson filter it adds).

The corpus: the chat template of every model under models/ that carries one,
and templates written here in the shapes of the common families (ChatML with
tools, Llama 3.1's tool format, Mistral's, Gemma's, a reasoning template in
the Qwen3 style) plus ones that exercise the language feature by feature.
Each is rendered for several conversations (system prompts, multi-turn
history, tool calls and tool results, non-ASCII text), with and without the
generation prompt; tern's output must equal jinja2's byte for byte, and
where jinja2 raises, tern must fail with exit status 1 (and, for
raise_exception, the same message).
"""
import datetime
import json
import os
import subprocess
from pathlib import Path

import pytest

import jinja2  # the oracle: scripts/setup installs it
from jinja2 import nodes  # noqa: E402
from jinja2.ext import Extension, loopcontrols  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

SOURCE = Path(os.environ.get("TERN_SOURCE", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("TERN_BUILD", SOURCE / "build"))
TERN = BUILD / "tern"
MODELS = SOURCE / "models"
NOW = "2026-03-07T09:05:00"


class Generation(Extension):
    """{% generation %}...{% endgeneration %}: renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body", []), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromisoformat(NOW).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# ---- conversations ------------------------------------------------------------------

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
CALC_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Adds two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                   "required": ["a", "b"]}}}

CONVERSATIONS = {
    "single": [{"role": "user", "content": "Hello!"}],
    "system": [{"role": "system", "content": "You are a terse assistant."},
               {"role": "user", "content": "What is 2+2?"}],
    "multi_turn": [{"role": "system", "content": "Be kind."},
                   {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke\nabout cats."}],
    "unicode": [{"role": "user", "content": "Ünïcödé: 日本語, emoji 🐈, quotes \"x\" and 'y', tab\tend"},
                {"role": "assistant", "content": "Понял — ça va ✓"},
                {"role": "user", "content": "  leading and trailing spaces  "}],
    "tools": [{"role": "system", "content": "Use tools when needed."},
              {"role": "user", "content": "Weather in Paris, and 2+3?"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
                  {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3.5}}}]},
              {"role": "tool", "name": "get_weather", "content": "{\"temp\": 18, \"sky\": \"clear\"}"},
              {"role": "tool", "name": "add", "content": "5.5"},
              {"role": "assistant", "content": "Paris is 18°C and clear; 2 + 3.5 = 5.5."},
              {"role": "user", "content": "Thanks!"}],
    "string_arguments": [{"role": "user", "content": "add 1 and 2"},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}]},
                         {"role": "tool", "content": "3"}],
    "reasoning": [{"role": "user", "content": "Is 17 prime?"},
                  {"role": "assistant", "content": "<think>\nCheck divisors up to 4.\n</think>\n\nYes, 17 is prime."},
                  {"role": "user", "content": "And 21?"}],
    "no_system_assistant_last": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}],
}
TOOLS = [WEATHER_TOOL, CALC_TOOL]

# ---- templates written here ---------------------------------------------------------

TEMPLATES = {
    # ChatML with a default system prompt and tools (the Qwen2.5 shape).
    "chatml_tools": """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
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
""",
    # The Llama 3.1 shape: a dated system header, tools as JSON in the first user turn.
    "llama31_tools": """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools is not none and messages | length > 0 %}
    {%- set first_user_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, respond with a JSON function call.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- for tool_call in message.tool_calls %}
            {%- set tool_call = tool_call.function %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
            {{- "<|eot_id|>" }}
        {%- endfor %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
""",
    # Mistral's shape: alternation enforced with raise_exception, system folded into the last user turn.
    "mistral": """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.last and system_message is defined %}
            {{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content']|trim + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
""",
    # Gemma's shape: no system turn (folded into the first user turn), assistant named model.
    "gemma": """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
""",
    # A reasoning template in the Qwen3 shape: the last user query found by a
    # reversed walk with a namespace, thinking split off the content.
    "reasoning": """{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == "user" or message.role == "system" %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + content + '\\n</tool_response><|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
""",
    # Whitespace control without the dashes: trim_blocks and lstrip_blocks do the work.
    "plain_blocks": """{% for m in messages %}
  {% if m.role == 'user' %}
User: {{ m.content }}
  {% else %}
{{ m.role|capitalize }}: {{ m.content }}
  {% endif %}
{% endfor %}
{% if add_generation_prompt %}Assistant:{% endif %}
""",
    # Loop variables, filters on loops, else, break and continue, cycle.
    "loops": """{% for m in messages if m.role != 'system' %}
{{ loop.index }}/{{ loop.length }} {{ loop.revindex0 }} {{ loop.cycle('odd', 'even') }}{% if loop.first %} first{% endif %}{% if loop.last %} last{% endif %}
{% if loop.previtem is defined %}after {{ loop.previtem.role }}{% endif %}: {{ m.content|length }}
{% endfor %}
{% for x in [] %}never{% else %}empty loop{% endfor %}
{% for i in range(10) %}{% if i == 7 %}{% break %}{% endif %}{% if i is odd %}{% continue %}{% endif %}{{ i }},{% endfor %}
{% for k, v in {'b': 1, 'a': [1, 2], 'c': {'x': none}}.items() %}{{ k }}={{ v }};{% endfor %}
{% for k in {'z': 1, 'y': 2} %}{{ k }}{% endfor %}
{% for a, b in [[1, 'one'], [2, 'two']] %}{{ a ~ ':' ~ b }} {% endfor %}
""",
    # Expressions: arithmetic, comparison chains, membership, conditionals, literals, str()/repr text.
    "expressions": """{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 - 4 }}
{{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.0e-5 }} {{ 3.0 }} {{ 10 / 5 }} {{ (1, 2) | list }}
{{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }} {{ 'a' in 'cat' }} {{ 2 not in [1, 2] }} {{ 'k' in {'k': 1} }}
{{ 'yes' if messages|length > 1 else 'no' }} [{{ 'x' if false }}] {{ none }} {{ true }} {{ [1, 'a', none, true, 2.5] }}
{{ {'a': 1, 'b': [none, 'q"uote'], "c'": 'it\\'s'} }} {{ 'a' ~ 1 ~ none ~ [2] }} {{ 'ab' * 3 }} {{ [0] * 2 }}
{{ not none and 'x' or 'y' }} {{ 0 or '' or 'last' }} {{ 1 and 0 }} {{ -(3) }} {{ 'Ü' < 'ü' }} {{ [1, 2] < [1, 3] }}
{{ "esc: \\t|\\\\|\\x41\\u00e9\\U0001F600" }} {{ 'adjacent' 'literals' }} {{ 1_000 + 0 }}
""",
    # String methods and slices, on ASCII and non-ASCII text.
    "strings": """{% set s = '  Hello, Wörld! héllo  ' %}
[{{ s.strip() }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] [{{ s.strip(' H!') }}] [{{ s.upper() }}] [{{ s.lower() }}]
[{{ s.title() }}] [{{ 'hello wORLD'.capitalize() }}] [{{ s.replace('l', 'L') }}] [{{ s.replace('l', 'L', 2) }}]
{{ s.split() }} {{ s.split(',') }} {{ 'a,b,,c'.split(',', 1) }} {{ s.startswith('  He') }} {{ s.endswith(('x', '  ')) }}
{{ s.find('W') }} {{ s.find('zz') }} {{ s.count('l') }} {{ '-'.join(['a', 'b', 'c']) }} {{ 'a\\nb\\r\\nc'.splitlines() }}
{{ s[2:7] }} {{ s[-5:] }} {{ s[::-1] }} {{ s[::3] }} {{ s[0] }} {{ s[-3] }} {{ s|length }} {{ 'é'|length }}
{{ messages[-1].content[:5] }} {{ messages[::-1]|map(attribute='role')|join(',') }} {{ messages[1:-1]|length }}
{{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ 'Ab'.islower() }} {{ '  '.isspace() }}
""",
    # Filters, one after another.
    "filters": """{{ messages|map(attribute='role')|unique|list }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }}
{{ messages|rejectattr('role', 'eq', 'user')|map(attribute='role')|join('+') }} {{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }}
{{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ [3, 1, 2]|sort(reverse=true) }} {{ messages|sort(attribute='role')|map(attribute='role')|list }}
{{ {'b': 2, 'a': 1, 'C': 3}|dictsort }} {{ {'b': 2, 'a': 1}|dictsort(by='value', reverse=true) }} {{ {'x': 1}|items|list }}
{{ [1, 2, 3]|sum }} {{ [1.5, 2]|sum }} {{ [4, 9, 2]|max }} {{ ['b', 'a']|min }} {{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|reverse }}
{{ undefined_thing|default('fallback') }} {{ ''|default('empty', true) }} {{ none|default('kept') }} {{ 42|string ~ '!' }}
{{ '3'|int + 1 }} {{ '3.7'|float }} {{ 'x'|int }} {{ 3.99|int }} {{ -2.5|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 3.14159|round(1, 'floor') }}
{{ 'hello world'|title }} {{ 'a-b c(d'|title }} {{ 'MiXeD'|lower }} {{ 'MiXeD'|upper }} {{ '  pad  '|trim }} {{ 'xxhixx'|trim('x') }}
{{ 'line1\\nline2\\n\\nline4'|indent(2) }}
{{ 'line1\\nline2'|indent(3, true) }} {{ 'a b  c'|wordcount }} {{ 'x'|center(7) }}|
{{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|map('string')|join }} {{ ['a', 'b']|map('upper')|list }} {{ [0, 1, 2, none]|select|list }}
{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('divisibleby', 2)|list }} {{ 'hello'|replace('l', '_') }} {{ '<b>&'|e }}
{{ messages[0]|tojson }}
{{ {'k': [1, 2.0, 'é', none, true], 'n': {}}|tojson(indent=2) }}
{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }} {{ 'ü'|tojson(ensure_ascii=true) }} {{ messages|length }} {{ messages|count }}
{{ 'ü'|tojson(true) }} {{ [1, 'ü']|tojson(false, 2) }} {{ {'b': 1, 'a': 2}|tojson(false, none, none, true) }}
""",
    # Tests.
    "tests": """{{ messages is defined }} {{ nope is undefined }} {{ none is none }} {{ 'x' is string }} {{ 1 is number }} {{ 1.5 is integer }}
{{ 2 is even }} {{ 9 is divisibleby 3 }} {{ {} is mapping }} {{ [] is iterable }} {{ 'x' is sequence }} {{ true is boolean }}
{{ false is false }} {{ 1 is true }} {{ messages[0] is mapping }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 2 is in [1, 2] }}
{{ 3 is gt 2 }} {{ 3 is ge 3 }} {{ 3 is lt 2 }} {{ 3 is ne 3 }} {{ none is sameas none }} {{ range is callable }} {{ 1 is not string }}
""",
    # Macros, set blocks, filter blocks, raw blocks, comments, namespaces.
    "blocks": """{% macro turn(role, text='(empty)', close='<end>') -%}
[{{ role }}] {{ text }}{{ close }}
{%- endmacro %}
{% for m in messages %}{{ turn(m.role, m.content) }}
{% endfor %}{{ turn('note') }} {{ turn('kw', close='!', text='named') }}
{% set captured %}Messages: {{ messages|length }}{% endset %}{{ captured|upper }}
{% filter upper %}shout {{ messages[0].role }}{% endfilter %}
{% raw %}{{ not rendered }} {% if %}{% endraw %}
{# a comment #}after comment
{%- set ns = namespace(count=0, names=[]) %}
{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.names = ns.names + [m.role] %}{% endfor %}
{{ ns.count }} {{ ns.names }}
{% set outer = 'before' %}{% for i in range(2) %}{% set outer = 'inside' %}{% endfor %}{{ outer }}
{% generation %}generated {{ messages|length }}{% endgeneration %}
""",
    # Whitespace control in every combination.
    "whitespace": """A  {{- ' x ' -}}  B
  {%- if true %}
    C
  {%+ endif %}
    {% if true -%}   D   {%- endif %}
  {# comment #}
E {{ 'F' }}
  {%+ if true %}G{% endif +%}
H
{%- for i in range(3) %}
  {{ i }}
{%- endfor %}
I   {%- raw -%}   J   {%- endraw -%}   K
""",
    # A date in the system prompt.
    "dates": """{{ strftime_now('%Y-%m-%d %H:%M') }} {{ strftime_now('%d %b %Y') }} {{ strftime_now('%A, %B %-d') if false else 'ok' }}""",
    # Errors that must be errors.
    "raise": """{% if messages|length > 1 %}{{ raise_exception('Conversation too long: ' ~ messages|length ~ ' messages') }}{% endif %}ok""",
    "undefined_attribute": """{{ missing.attr }}""",
    "bad_operands": """{{ messages[0] + 1 }}""",
}

BAD_SYNTAX = [
    "{% if x %}unclosed",
    "{{ 1 + }}",
    "{% for %}{% endfor %}",
    "{{ x | nosuchfilter }}",
    "{% include 'other.jinja' %}",
    "{{ 'unterminated }}",
    "{% endif %}",
    "{{ x is nosuchtest }}",
]


# ---- running both -------------------------------------------------------------------

def model_templates():
    import gguf
    found = {}
    for path in sorted(MODELS.glob("*.gguf")):
        reader = gguf.GGUFReader(str(path))
        field = reader.fields.get("tokenizer.chat_template")
        if field is None:
            continue
        found[path.name] = (path, bytes(field.parts[-1]).decode("utf-8"))
    return found


def render_jinja2(source, messages, tools, add_generation_prompt, bos="<s>", eos="</s>", kwargs=None):
    try:
        t = environment().from_string(source)
        return t.render(messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt,
                        bos_token=bos, eos_token=eos, **(kwargs or {})), None
    except jinja2.exceptions.TemplateError as e:
        return None, e
    except TypeError as e:
        return None, e


def render_tern(tmp_path, source, messages, tools, add_generation_prompt, bos="<s>", eos="</s>", model=None,
                kwargs=None):
    msgs = tmp_path / "messages.json"
    msgs.write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
    args = [str(TERN), "template", "--messages", str(msgs), "--now", NOW]
    if model is not None:
        args += ["-m", str(model)]
    else:
        tf = tmp_path / "template.jinja"
        tf.write_bytes(source.encode("utf-8"))
        args += ["--file", str(tf), "--bos", bos, "--eos", eos]
    if tools is not None:
        tj = tmp_path / "tools.json"
        tj.write_text(json.dumps(tools), encoding="utf-8")
        args += ["--tools", str(tj)]
    if not add_generation_prompt:
        args.append("--no-generation-prompt")
    if kwargs:
        args += ["--kwargs", json.dumps(kwargs)]
    p = subprocess.run(args, capture_output=True, timeout=60)
    return p.returncode, p.stdout.decode("utf-8"), p.stderr.decode("utf-8", "replace")


def check(tmp_path, name, source, conv, tools, gen, model=None, bos="<s>", eos="</s>", kwargs=None):
    messages = CONVERSATIONS[conv]
    want, err = render_jinja2(source, messages, tools, gen, bos, eos, kwargs)
    rc, got, stderr = render_tern(tmp_path, source, messages, tools, gen, bos, eos, model, kwargs)
    where = f"{name} / {conv} / tools={tools is not None} / generation={gen}"
    if err is not None:
        assert rc == 1, f"{where}: jinja2 raised {err!r}, tern printed {got!r}"
        if "raise" in name:
            assert str(err) in stderr, f"{where}: tern's message {stderr!r} lacks {str(err)!r}"
        return
    assert rc == 0, f"{where}: tern failed: {stderr}"
    assert got == want, f"{where}:\n--- jinja2\n{want!r}\n--- tern\n{got!r}"


def test_tern_is_built():
    assert TERN.exists(), f"{TERN} not found: build tern first"


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("conv", sorted(CONVERSATIONS))
def test_written_templates(tmp_path, name, conv):
    for tools in (None, TOOLS):
        for gen in (True, False):
            check(tmp_path, name, TEMPLATES[name], conv, tools, gen)


def test_template_variables_pass_through(tmp_path):
    for flag in (True, False):
        check(tmp_path, "reasoning", TEMPLATES["reasoning"], "reasoning", None, True,
              kwargs={"enable_thinking": flag})


def test_model_templates(tmp_path):
    found = model_templates()
    assert found, "no model under models/ carries a chat template: run scripts/setup"
    for name, (path, source) in found.items():
        reader_bos_eos = model_special_tokens(path)
        for conv in sorted(CONVERSATIONS):
            for gen in (True, False):
                check(tmp_path, name, source, conv, None, gen, model=path, bos=reader_bos_eos[0],
                      eos=reader_bos_eos[1])


def model_special_tokens(path):
    import gguf
    reader = gguf.GGUFReader(str(path))
    tokens = reader.fields["tokenizer.ggml.tokens"]

    def token(key):
        f = reader.fields.get(key)
        if f is None:
            return ""
        i = int(f.parts[-1][0])
        return bytes(tokens.parts[tokens.data[i]]).decode("utf-8")
    return token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")


@pytest.mark.parametrize("source", BAD_SYNTAX)
def test_syntax_errors_fail_with_a_message(tmp_path, source):
    # jinja2 refuses include without a loader with a TypeError; the rest are TemplateErrors.
    with pytest.raises((jinja2.exceptions.TemplateError, TypeError)):
        environment().from_string(source).render(x=1, messages=[])
    rc, out, err = render_tern(tmp_path, source, [], None, True)
    assert rc == 1 and out == "", f"{source!r}: rc {rc}, out {out!r}"
    assert "tern template: error:" in err and len(err.strip()) > len("tern template: error:")


def test_runaway_templates_stop_at_the_limits(tmp_path):
    # The step and time limits are tested with small limits in tests/unit/test_jinja.cpp: at the
    # command's defaults they cost seconds of CPU, more under a sanitizer.
    runaway = {
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}": "deeper",
        "{% for i in range(1000000) %}{{ 'x' * 100 }}{% endfor %}": "output",
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}": "bytes",
        "{{ 'x' * 1000000000 }}": "string would pass",
        "{{ 'x'|center(1000000000) }}": "string would pass",
    }
    for source, why in runaway.items():
        rc, out, err = render_tern(tmp_path, source, [], None, True)
        assert rc == 1 and out == "", f"{source!r}: rc {rc}"
        # Under a sanitizer (several times slower) the time limit may stop a loop first.
        assert why in err or "time limit" in err, f"{source!r}: {err}"

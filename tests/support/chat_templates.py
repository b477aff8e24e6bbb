# ruff: noqa: E501 (the templates are kept verbatim, as the model folders ship them)
"""The chat templates of the model families fastlm users fine-tune, as their tokenizer_config.json ships them,
and small offline tokenizers that carry them: Qwen3 (Qwen/Qwen3-4B: ``<|im_start|>`` / ``<|im_end|>`` turns,
an empty think block before the answer when ``enable_thinking`` is false) and Llama-3.2 instruct
(meta-llama/Llama-3.2-3B-Instruct: ``<|start_header_id|>`` headers, ``<|eot_id|>`` ends a turn, a dated system
header). No hub access."""

from __future__ import annotations

# Qwen/Qwen3-4B (and Qwen3-4B-Base, which ships the same template), tokenizer_config.json "chat_template".
QWEN3_CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
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
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

# meta-llama/Llama-3.2-3B-Instruct (the 3.1 / 3.3 instruct templates are the same in what is used here).
LLAMA32_CHAT_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
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
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
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
"""

QWEN3_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]


def _byte_level_bpe(texts: list[str], special: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return backend


def qwen3_style_tokenizer(texts: list[str], *, vocab_size: int = 400, base: bool = False):
    """A byte-level BPE with Qwen3's special tokens and chat template: no BOS; EOS ``<|im_end|>`` (the instruct
    models' end of turn) or, ``base``, ``<|endoftext|>`` (Qwen3-*-Base, whose template still ends each turn
    with ``<|im_end|>``); pad ``<|endoftext|>``."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_byte_level_bpe(texts, QWEN3_SPECIAL, vocab_size),
        eos_token="<|endoftext|>" if base else "<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer


def llama3_style_tokenizer(texts: list[str], *, vocab_size: int = 400, base: bool = False):
    """A byte-level BPE with Llama-3's special tokens and the Llama-3.2 instruct chat template: BOS
    ``<|begin_of_text|>`` in front of every text (the template writes it too); EOS ``<|eot_id|>`` (instruct)
    or, ``base``, ``<|end_of_text|>`` (Llama-3.2-3B, whose template still ends each turn with ``<|eot_id|>``)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    backend = _byte_level_bpe(texts, LLAMA3_SPECIAL, vocab_size)
    backend.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>" if base else "<|eot_id|>",
        additional_special_tokens=["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = LLAMA32_CHAT_TEMPLATE
    return tokenizer


# A Qwen-style template for function calling: the tools (JSON schemas) in the system turn, an assistant turn's
# calls as <tool_call>{json}</tool_call>, each tool result in a <tool_response> user turn. With ``tool_calls``
# false it writes an assistant turn's content only (a template that does not render tool calls).
_TOOLS_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
    {{- '# Tools\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
    {{- '\\n</tools><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' + (message.content or '') }}
        {%- if RENDER_CALLS and message.tool_calls %}
            {%- for call in message.tool_calls %}
                {%- if call.function %}{%- set call = call.function %}{%- endif %}
                {%- if not loop.first or message.content %}{{- '\\n' }}{%- endif %}
                {{- '<tool_call>{"name": "' + call.name + '", "arguments": ' }}
                {{- call.arguments if call.arguments is string else (call.arguments | tojson) }}
                {{- '}</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""
QWEN_STYLE_TOOLS_TEMPLATE = _TOOLS_TEMPLATE.replace("RENDER_CALLS", "true")
NO_TOOL_CALLS_TEMPLATE = _TOOLS_TEMPLATE.replace("RENDER_CALLS", "false")

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def tool_call(city: str, name: str = "get_weather") -> dict:
    """An assistant turn's call of ``name`` with ``{"city": city}``, as OpenAI-style chat data holds it."""
    return {"type": "function", "function": {"name": name, "arguments": {"city": city}}}


def tool_chat(city: str, *, answer: str | None = None, system: str | None = None) -> list[dict]:
    """A function-calling chat: the user asks, the assistant calls ``get_weather`` for ``city``, the tool
    answers, and the last turn is a second call (``answer`` None) or the assistant's answer."""
    chat = [{"role": "system", "content": system}] if system else []
    chat += [
        {"role": "user", "content": f"{city} 날씨 알려줘"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call(city)]},
        {"role": "tool", "content": f'{{"city": "{city}", "temp": {len(city)}}}'},
    ]
    if answer is not None:
        return [*chat, {"role": "assistant", "content": answer}]
    return [*chat, {"role": "assistant", "content": "", "tool_calls": [tool_call(city + " 근교")]}]


def tool_chat_rows(count: int) -> list[dict]:
    """``count`` rows of ``{"messages", "tools"}``: chats that end with a tool call (even rows) or with the
    answer after the tool's result (odd rows), each with the weather tool's schema."""
    return [
        {
            "messages": tool_chat(f"도시{i}", answer=None if i % 2 == 0 else f"도시{i}은 {i}도입니다."),
            "tools": [WEATHER_TOOL],
        }
        for i in range(count)
    ]


def tool_calling_tokenizer(
    texts: list[str], *, template: str = QWEN_STYLE_TOOLS_TEMPLATE, vocab_size: int = 400
):
    """``qwen3_style_tokenizer`` with ``template`` (the Qwen-style function-calling one by default)."""
    tokenizer = qwen3_style_tokenizer(texts, vocab_size=vocab_size)
    tokenizer.chat_template = template
    return tokenizer


# The ShareGPT speaker each role is written as (``sharegpt_chat``): the form of ShareGPT, Hermes
# function-calling and many Korean chat corpora.
SHAREGPT_SPEAKERS = {"user": "human", "assistant": "gpt", "system": "system", "tool": "tool"}


def sharegpt_chat(chat: list[dict]) -> list[dict]:
    """A role/content chat written as ShareGPT turns: ``{"from": human | gpt | system | tool, "value": text}``,
    its other fields (a call's ``tool_calls``) kept."""
    return [
        {
            "from": SHAREGPT_SPEAKERS[turn["role"]],
            "value": turn["content"],
            **{key: value for key, value in turn.items() if key not in ("role", "content")},
        }
        for turn in chat
    ]

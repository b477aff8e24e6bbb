#!/usr/bin/env bash
# The command a GPU session runs first (the device tool runs one command of at most 2,000 characters for at
# most 10 minutes, copying the repository and the paths named in `carry`; what is under $OUT comes back, at
# most 8 files). Here, beforehand: `bash scripts/gpu_wheels.sh`; there, with carry [".whl"]:
#
#   bash benchmarks/gpu_session.sh                       the plan below, time permitting (540 s in all)
#   bash benchmarks/gpu_session.sh --only gpu_speed_lora              one step (or several, comma-separated)
#   bash benchmarks/gpu_session.sh --budget-s 300 --dry-run           print the plan, run nothing
#
# 1. the wheels in .whl/ (if any) installed into /tmp/site; PYTHONPATH = src (fastlm is not installed there)
#    and /tmp/site; nvidia-smi, Python and package versions, and every import the benchmarks need; then
#    benchmarks/liger_head_check.py (a few seconds: the fused head through liger's kernel in fastlm's loop
#    against fastlm's own kernel, PASS/FAIL, before any figure that depends on it) and
#    benchmarks/gpu_attention_check.py --family gemma3 (packed samples in local layers' windows, at most 75 s)
# 2. the plan, most wanted first (a session lent a GPU has about 15 minutes of it, starts included), each
#    step under `timeout` (its own cap, never past what is left of --budget-s) and started only when at least
#    its minimum is left; its log tee'd into $OUT. Sized on the H100 sessions of 2026-11-26 to 2026-11-28
#    (docs/gpu-runs): the 3B base model's preparation about 30 s, a 3B model's load 16 s, fastlm's LoRA
#    55 s, the Trainer + peft's best (eager) 33 s and its usual set-up more than 79 s on the 3B shape, the
#    0.73 B full fine-tune eager 36-58 s a contender, compiled 147 s (more than 119 s on a fresh machine:
#    its inductor cache is empty; the whole model, though asked by layers: gpu_speed.py's runtime lacked the
#    scope until 2026-11-27's eighth session), the QLoRA usual set-up about 5 s a step:
#      full_trainer_compiled_liger  the 0.73 B full fine-tune, fastlm eager against the Trainer's best set-up
#                          with Liger and torch_compile (the target's "best with Liger"; compiled whole with
#                          Liger it did not finish in 107 s, 2026-11-27, or failed, 2026-11-28; now by regions
#                          with dynamic shapes, gpu_speed.trainer_compile_env: without Liger its first step
#                          took 18.3 s and fastlm eager ran 1.11x it, H200, 2026-11-28)
#      full_inductor_ab    fastlm's 0.73 B full fine-tune compiled by layers, one run: liger's RMSNorm, rotary
#                          and SwiGLU kernels inside each compiled layer (fastlm_compile: opaque to inductor,
#                          their backward in place) against inductor's own (fastlm_compile_inductor_layers:
#                          train.model.liger off, the head's kernel still liger's); liger's SwiGLU and RMSNorm
#                          backward were among the kernels that grew compiled (H200, 2026-11-28)
#      full_profile_eager / full_profile_compiled  fastlm's 0.73 B full fine-tune alone, eager, then compiled
#                          by layers, each run and profiled (--profile always): the kernel time of each by kind
#                          (gpu_speed.kernel_kinds), the A/B behind compiled's slower kernels (176.5 ms a step
#                          compiled, 158.8 eager, on two days: the compiled GPU idle 2.9 %, eager's 13.8 %)
#      gpu_speed_lora_compiled  the LoRA run compiled by layers, fastlm against the Trainer + peft's best set-up
#                          with its torch_compile, without Liger (--trainer-liger off): with Liger its compile
#                          did not finish its first step in 93 s (H200, 2026-11-28; fastlm 1.34x its eager
#                          run with Liger); on a CPU its LoRA compile without Liger compiles one graph for
#                          layers 1..N (layer 0 one more: its input needs no gradient), no graph break, and
#                          takes as long for 8 layers as for 2, as the full fine-tune's (18.3 s on the H200)
#      lora_compiled_ab / qlora_compiled_ab  fastlm's LoRA / QLoRA eager and compiled by layers
#                          (fastlm_lora_compiled, fastlm_qlora_compiled) beside Trainer + peft's best set-up
#                          eager with Liger, one run: what compiling the adapter layers gains (the eager QLoRA
#                          step left the H200 idle 29 % waiting for the host; LoRA compiled by layers ran at
#                          62.3 % MFU, H200, 2026-11-28)
#      lora_reviews        the LoRA run on short texts with real reviews' lengths (--texts reviews: about
#                          19 tokens each, 100 per packed row), the users' corpora, the same peers
#      lora_dora           the LoRA run with DoRA adapters on every side (--lora-variant dora): fastlm's fused
#                          DoRA forward against peft's DoRA forward and Trainer + peft's best set-up with DoRA,
#                          every side eager (on a 2-core CPU, 2026-11-28: 2.10x and 2.54x, DoRA at plain
#                          LoRA's speed)
#      gpu_speed_full      benchmarks/gpu_speed.py --model 0.5b: fastlm (compiled by layers) against the
#                          Trainer's best set-up (Liger, padding-free, torch_compile; a try that fails or does
#                          not finish is run again without it: on an H200, 2026-11-28, its compile stopped in
#                          inductor's autotuning with an illegal memory access); fastlm 49.5 % MFU there
#      full_accum4         the 0.73 B full fine-tune at 4 micro-batches of 8 rows a step (65,536 token slots a
#                          step, a real fine-tune's; the Trainer's best set-up accumulating alike), both eager:
#                          the optimizer and the host's work per step spread over 4x the tokens
#      gpu_speed_full_eager the full fine-tune of the 0.73 B model, fastlm (bf16 weights with fp32 masters, the
#                          GPU default) against the Trainer's best set-up (padding-free, Liger, tf32, fused
#                          AdamW), both eager (the Trainer's torch_compile had not finished in 107 s): the
#                          1.3x target (1.52x on an H200, 2026-11-27)
#      in_backward_3b      the 3B full fine-tune's peak memory with train.optimizer.in_backward (each fp32
#                          master updated in the backward, its gradient freed: 12.8 GB by count) against
#                          fastlm_eager, one eager run
#      head_kernels        benchmarks/linear_loss_memory.py --device cuda: the LM head + loss of a 3B model
#                          (8,192 tokens x 128,256, bf16 autocast, a trained head) through fastlm's kernel,
#                          liger's and cut-cross-entropy's against the plain head: time and peak memory (the
#                          A/B of train.loss.fused_linear_kernel); more than 77 s on 2026-11-27
#      gpu_speed_full_3b   the full fine-tune on the Llama-3.2-3B shape, fastlm against the Trainer's best
#                          set-up, both eager, 2 rows of 2048 per step, every other layer checkpointed on
#                          both sides (51 GB of fp32 weights, gradients and AdamW states before activations):
#                          the 1.3x target on 3B (1.50x on an H200, 2026-11-28; float8 auto measured slower
#                          there and kept the plain layers)
#      full_eager_b16      fastlm's 0.73 B full fine-tune alone, eager, at 16 packed rows of 2048 a micro-batch
#                          (twice the tokens of the ratio's runs): the MFU target at a larger micro-batch
#                          (55.6 % on an H200, 2026-11-28; 52.0 % at 8 rows, 2026-11-27)
#      memory_cliff        benchmarks/memory_cliff.py: the 24 GB QLoRA cliff (reproduced on the H100 and twice
#                          on the H200: micro-batch 16 out of memory) and fastlm's tune ladder, eager, packed,
#                          sizes 1..32, tune.max_minutes 1.5 (at its defaults the ladder had not finished in 150 s)
#      lora_usual          fastlm's LoRA against Trainer + peft's usual set-up (dynamic padding, the same
#                          tokens per optimizer step): the 2x target (5.23x on 2026-11-26)
#      qlora_forward_ab    fastlm's QLoRA with its own forward over the 4-bit layers against peft's, one run
#      lora_own_head       fastlm's LoRA with fastlm's own chunked PyTorch head kernel instead of liger's
#      weights_ab_compiled the bf16 weights' A/B compiled by layers (the full fine-tune's compiled set-up): on
#                          this CPU compiled, bf16 weights ran 0.87-0.95x fp32 ones; the GPU decides auto's
#                          default for compiled runs (eager: 1.15x, 0.86x the memory, 2026-11-27)
#      full_cudagraphs     the 0.73 B full fine-tune compiled by layers with CUDA graphs (--compile-mode
#                          reduce-overhead) against the Trainer's best set-up: the MFU target (52.0 % eager on
#                          an H200, its GPU idle 13.8 % of the step waiting for the host)
#      liger_on/liger_off  benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_compile --fused-linear on
#                          --liger on / off: liger-kernel against fastlm's own kernels
#      compile_scope       benchmarks/compile_scope.py on the 0.73 B shape: torch.compile of the whole model
#                          against each layer (cold start and steady speed), the choice of the default
#      levers              benchmarks/gpu_levers.py: every GPU lever for a few steps (PASS/FAIL/SKIP against
#                          the baseline), 4 at once; 16 passed on the H100 (docs/gpu-runs/2026-11-26-h100-*)
#      weights_ab          the 0.73 B full fine-tune, eager: bf16 weights with fp32 masters against autocast
#                          over fp32 weights (1.15x on 2026-11-27), again
#      lora_variants       fastlm's LoRA against its other variants, one run: liger's own autograd function
#                          for the fused head (3 host syncs per micro-batch), each LoRA layer on its own (no
#                          shared-input groups) and peft's own LoRA forward (on an H200, 2026-11-27: fastlm
#                          1.10x, 1.02x and 1.31x them)
#      gpu_speed_lora      benchmarks/gpu_speed.py --model 3b: LoRA, fastlm vs Trainer + peft's best set-up and
#                          TRL's SFTTrainer + peft best (packing, padding-free, its chunked head) on the
#                          Llama-3.2-3B shape (2048-token packed rows, micro-batch 4), every side eager: the
#                          1.5x target (1.53x and 1.58x on an H100 with bf16 adapters, 2026-11-28)
#      lora_cudagraphs     fastlm's LoRA compiled by layers with CUDA graphs (fastlm_lora_cudagraphs:
#                          train.runtime.compile_mode reduce-overhead, one launch per layer over micro-batches
#                          of one shape) against fastlm's eager LoRA and the Trainer + peft's best, one run
#                          (3.15x slower than eager on an H100, 2026-11-28: to profile)
#      lora_ab             fastlm's LoRA (bf16 adapters with fp32 masters, param_dtype auto on a GPU) against
#                          fp32 adapters under autocast (each adapter cast per micro-batch, 392 casts each way;
#                          1.06x on an H100, 2026-11-28)
#      full_compiled_ab    the 0.73 B full fine-tune, one run: fastlm eager, fastlm compiled by layers and the
#                          Trainer's best compiled without Liger (H200, 2026-11-28: compiled 0.94x eager; the
#                          Trainer's compile did not finish in 116 s)
#      gpu_speed_qlora     the QLoRA run (4-bit NF4 base) against Trainer + peft's best and usual set-ups and
#                          TRL's, 3 + 8 steps (H200, 2026-11-28, three of them in another call: 1.91x best,
#                          14.68x usual; fastlm needs about 44 s a run, its loss check included)
#      full_trainer_compiled  the 0.73 B full fine-tune, fastlm eager against the Trainer's best set-up with
#                          its torch_compile, without Liger (--trainer-liger off), accelerate's dynamic shapes
#                          and regional compilation set (gpu_speed.trainer_compile_env)
#      qlora_checkpointed  fastlm's QLoRA with --checkpointing selective (every other layer) against Trainer +
#                          peft's usual set-up (peft's default: every layer checkpointed): the peak memory
#                          beside the usual set-up's (fastlm without checkpointing held 1.30x it, 14.68x its
#                          speed, H200, 2026-11-28)
#      full_b16            the 0.73 B full fine-tune at 16 packed rows of 2048 a micro-batch, fastlm against the
#                          Trainer's best set-up at the same tokens per optimizer step, both eager: the ratio
#                          where fastlm reached its 55.6 % MFU (H200, 2026-11-28; 1.52x at 8 rows, 2026-11-27);
#                          the Trainer held 42 GB at 8 rows: twice that fits an H200, maybe not an H100
#    Measured on 2026-11-28 (ninth session, H200) and kept last, to run again: full_trainer_compiled
#    (1.11x, the Trainer's compile finished: 18.3 s), qlora_checkpointed (11.72x, 0.76x the memory), full_b16
#    (1.21x). The first call (560 s) runs full_trainer_compiled_liger (at most 260 s), full_inductor_ab (180 s)
#    and the eager profile (a run, then its profile, which needs about as long); the next call (what is left
#    of the 15 minutes: about 250 s, 35 of them the set-up) runs --only full_profile_compiled, or
#    full_profile_inductor where full_inductor_ab's inductor side won (the same run, liger's layer kernels off:
#    where its kernel time goes), or gpu_speed_lora_compiled; later sessions the rest.
# The gpu_speed.py steps share one --cache-dir ($FASTLM_GPU_CACHE, default /tmp/fastlm_gpu_cache): the
# prepared data and the adapters' base model are made by the first step of a key and reused by the next (a 3B
# base took 22-30 s to make and save).
# Files back in $OUT (8 at most): session.log, levers.log, levers.json and one log per other step.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu_session_out}
CACHE=${FASTLM_GPU_CACHE:-/tmp/fastlm_gpu_cache}  # gpu_speed.py --cache-dir: data and base model made once a session
budget_s=540
only=""
dry_run=0
# name | minimum seconds to start it | its own cap | command (CAP: the seconds it is given)
# the adapter runs on the 3B shape, both sides eager (--compile off turns the Trainer's torch_compile off too):
# a compile of a layer's graph took about 55 s there, more than a contender's share of the step
EAGER="--compile off --warmup 5 --steps 15"
SHORT="--compile off --warmup 3 --steps 8"  # the QLoRA usual set-up: about 5 s a step
SIZED="--compile-scope layers --warmup 5 --steps 15"  # one layer's compile; timed steps enough for a mean
PROFILED="--warmup 3 --steps 6"  # a run and its profile (3 more steps under the profiler) in one step's cap
PLAN=(
    "full_trainer_compiled_liger|230|260|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_eager trainer_best $SIZED --budget-s \$((CAP - 15))"
    "full_inductor_ab|150|180|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_compile fastlm_compile_inductor_layers $SIZED --profile never --budget-s \$((CAP - 15))"
    "full_profile_eager|110|120|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_eager --profile always $PROFILED --compile off --budget-s \$((CAP - 10))"
    "full_profile_compiled|160|170|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_compile --profile always $PROFILED --compile-scope layers --budget-s \$((CAP - 10))"
    "full_profile_inductor|160|170|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_compile --liger off --fused-kernel auto --profile always $PROFILED --compile-scope layers --budget-s \$((CAP - 10))"
    "gpu_speed_lora_compiled|240|330|benchmarks/gpu_speed.py --model 3b --contenders fastlm_lora trainer_lora_best --trainer-liger off $SIZED --budget-s \$((CAP - 15))"
    "lora_compiled_ab|240|330|benchmarks/gpu_speed.py --model 3b --contenders fastlm_lora fastlm_lora_compiled trainer_lora_best $EAGER --budget-s \$((CAP - 15))"
    "qlora_compiled_ab|200|280|benchmarks/gpu_speed.py --model 3b --contenders fastlm_qlora fastlm_qlora_compiled trainer_qlora_best $SHORT --budget-s \$((CAP - 15))"
    "lora_reviews|240|330|benchmarks/gpu_speed.py --model 3b --texts reviews --contenders fastlm_lora trainer_lora_usual trainer_lora_best trl_lora_best $EAGER --budget-s \$((CAP - 15))"
    "lora_dora|240|330|benchmarks/gpu_speed.py --model 3b --lora-variant dora --contenders fastlm_lora fastlm_lora_peft_forward trainer_lora_best $EAGER --budget-s \$((CAP - 15))"
    "gpu_speed_full|200|330|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_compile trainer_best $SIZED --budget-s \$((CAP - 15))"
    "full_accum4|200|260|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_eager trainer_best --accumulation 4 --compile off --warmup 2 --steps 5 --budget-s \$((CAP - 15))"
    "gpu_speed_full_eager|150|220|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_eager trainer_best $EAGER --budget-s \$((CAP - 15))"
    "in_backward_3b|240|330|benchmarks/gpu_speed.py --model 3b --contenders fastlm_eager fastlm_eager_in_backward --batch-size 2 --checkpointing selective $SHORT --budget-s \$((CAP - 15))"
    "head_kernels|150|200|benchmarks/linear_loss_memory.py --device cuda --precision bf16 --hidden 3072 --kernels liger liger_function cce --repeats 5"
    "gpu_speed_full_3b|240|330|benchmarks/gpu_speed.py --model 3b --contenders fastlm_eager trainer_best --batch-size 2 --checkpointing selective $SHORT --budget-s \$((CAP - 15))"
    "full_eager_b16|90|150|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_eager --batch-size 16 $EAGER --budget-s \$((CAP - 15))"
    "memory_cliff|120|240|benchmarks/memory_cliff.py --fastlm-compile off --modes packed --max-size 32 --tune-max-minutes 1.5"
    "lora_usual|160|200|benchmarks/gpu_speed.py --model 3b --contenders fastlm_lora trainer_lora_usual $EAGER --budget-s \$((CAP - 15))"
    "qlora_forward_ab|120|170|benchmarks/gpu_speed.py --model 3b --contenders fastlm_qlora fastlm_qlora_peft_forward $EAGER --budget-s \$((CAP - 15))"
    "lora_own_head|150|200|benchmarks/gpu_speed.py --model 3b --contenders fastlm_lora fastlm_lora_own_head $EAGER --budget-s \$((CAP - 15))"
    "weights_ab_compiled|300|360|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_compile fastlm_compile_fp32_weights $SIZED --budget-s \$((CAP - 15))"
    "full_cudagraphs|240|330|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_compile trainer_best $SIZED --compile-mode reduce-overhead --budget-s \$((CAP - 15))"
    "liger_on|120|240|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_compile --fused-linear on --liger on $SIZED --budget-s \$((CAP - 20))"
    "liger_off|120|240|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_compile --fused-linear on --liger off $SIZED --budget-s \$((CAP - 20))"
    "compile_scope|150|300|benchmarks/compile_scope.py --hidden 1536 --heads 16 --intermediate 4096 --vocab 32000 --seq-len 2048 --steps 10"
    "levers|60|150|benchmarks/gpu_levers.py --parallel 4 --json $OUT/levers.json --budget-s \$((CAP - 10))"
    "weights_ab|150|220|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_eager fastlm_eager_fp32_weights $EAGER --budget-s \$((CAP - 15))"
    "lora_variants|240|320|benchmarks/gpu_speed.py --model 3b --contenders fastlm_lora fastlm_lora_liger_function fastlm_lora_own_inputs fastlm_lora_peft_forward $EAGER --budget-s \$((CAP - 15))"
    "gpu_speed_lora|200|260|benchmarks/gpu_speed.py --model 3b --contenders fastlm_lora trainer_lora_best trl_lora_best $EAGER --budget-s \$((CAP - 15))"
    "lora_cudagraphs|240|300|benchmarks/gpu_speed.py --model 3b --contenders fastlm_lora trainer_lora_best fastlm_lora_cudagraphs $EAGER --budget-s \$((CAP - 15))"
    "full_compiled_ab|280|320|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_eager fastlm_compile trainer_best --trainer-liger off $SIZED --budget-s \$((CAP - 15))"
    "gpu_speed_qlora|220|300|benchmarks/gpu_speed.py --model 3b --contenders fastlm_qlora trainer_qlora_best trl_qlora_best trainer_qlora_usual $SHORT --budget-s \$((CAP - 15))"
    "lora_ab|150|200|benchmarks/gpu_speed.py --model 3b --contenders fastlm_lora fastlm_lora_fp32_adapters $EAGER --budget-s \$((CAP - 15))"
    "full_trainer_compiled|330|380|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_eager trainer_best --trainer-liger off $SIZED --budget-s \$((CAP - 15))"
    "qlora_checkpointed|170|220|benchmarks/gpu_speed.py --model 3b --contenders fastlm_qlora trainer_qlora_usual --checkpointing selective $SHORT --budget-s \$((CAP - 15))"
    "full_b16|150|200|benchmarks/gpu_speed.py --model 0.5b --contenders fastlm_eager trainer_best --batch-size 16 $EAGER --budget-s \$((CAP - 15))"
)
names() { local all=(); for step in "${PLAN[@]}"; do all+=("${step%%|*}"); done; echo "${all[*]}"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --budget-s) budget_s="$2"; shift 2 ;;
        --only) only="$2"; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h|--help) sed -n '2,/^set /p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_session.sh: unknown argument '$1'; see --help (--budget-s N, --only STEP[,STEP], --dry-run)" >&2
           exit 2 ;;
    esac
done
case "$budget_s" in
    ''|*[!0-9]*) echo "gpu_session.sh: --budget-s '$budget_s' is not a whole number of seconds; e.g. 540" >&2
                 exit 2 ;;
esac
for name in ${only//,/ }; do
    case " $(names) " in
        *" $name "*) ;;
        *) echo "gpu_session.sh: --only '$name' is not a step; the steps: $(names)" >&2; exit 2 ;;
    esac
done

start=$SECONDS  # the budget counts the install and the checks too
mkdir -p "$OUT"
log() { echo "$*" | tee -a "$OUT/session.log"; }
: > "$OUT/session.log"
log "gpu_session: budget ${budget_s} s, steps: ${only:-$(names)}$([ "$dry_run" = 1 ] && echo ' (dry run)')"

if [ "$dry_run" = 0 ]; then
    export PYTHONUNBUFFERED=1 DO_NOT_TRACK=true
    if compgen -G ".whl/*.whl" >/dev/null; then
        if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl 2>&1 | tail -n 5 | tee -a "$OUT/session.log"; then
            log "gpu_session: installing .whl/*.whl failed (above); going on with the machine's own packages"
        fi
        export PYTHONPATH="$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    else
        log "gpu_session: no .whl/ (run scripts/gpu_wheels.sh here and name .whl in carry); machine's packages"
        export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
    fi
    { nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1 || true; } \
        | tee -a "$OUT/session.log"
    "$PYTHON" - <<'EOF' 2>&1 | tee -a "$OUT/session.log"
import importlib, platform
print("python", platform.python_version())
for name in ("torch", "transformers", "accelerate", "peft", "trl", "datasets", "pydantic", "bitsandbytes",
             "liger_kernel", "cut_cross_entropy", "torchao", "triton", "fastlm.engine.train.loop"):
    try:
        module = importlib.import_module(name)
        print(f"  {name} {getattr(module, '__version__', 'ok')}")
    except Exception as error:  # shown, not fatal: the steps say what it costs them
        print(f"  {name} MISSING: {type(error).__name__}: {str(error).splitlines()[0][:150] if str(error) else ''}")
EOF
    # the fused head at auto runs liger's kernel in fastlm's loop on CUDA: checked against fastlm's kernel first
    timeout -k 5 90 "$PYTHON" benchmarks/liger_head_check.py 2>&1 | tee -a "$OUT/session.log"
    # packed samples kept to a local layer's window on this GPU's kernels (torch_varlen's window_size, flex's
    # windowed BlockMask, FA2 where installed: attention.windows, proven on CPU through their contracts)
    timeout -k 5 75 "$PYTHON" benchmarks/gpu_attention_check.py --family gemma3 --seeds 1 2>&1 \
        | tail -n 14 | tee -a "$OUT/session.log"
    # the tests that need CUDA (skipped on CPU machines): e.g. the fp16 schedule's device rate read by CUDA's
    # fused AdamW, the fused optimizer chosen on CUDA
    timeout -k 5 150 "$PYTHON" -m pytest -q -p no:cacheprovider -rs -k cuda \
        $(grep -rl "torch.cuda.is_available()" tests) 2>&1 | tail -n 15 | tee -a "$OUT/session.log"
fi

for step in "${PLAN[@]}"; do
    IFS='|' read -r name minimum cap command <<<"$step"
    if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then
        continue
    fi
    left=$((budget_s - (SECONDS - start)))
    if [ "$left" -lt "$minimum" ]; then
        log "[$name] skipped: ${left} s left of ${budget_s}, it needs ${minimum}; later: bash benchmarks/gpu_session.sh --only $name"
        continue
    fi
    CAP=$(( cap < left ? cap : left ))
    line="timeout -k 10 $CAP $PYTHON $(CAP=$CAP; eval echo "$command")"
    case "$command" in  # the steps of one session share the prepared data and the adapters' base model
        benchmarks/gpu_speed.py*) line="$line --cache-dir $CACHE" ;;
    esac
    if [ "$dry_run" = 1 ]; then
        log "[$name] at most ${CAP} s: $line > \$OUT/$name.log"
        start=$((start - CAP))  # the plan as if each step took its whole cap
        continue
    fi
    log "[$name] at most ${CAP} s: $line"
    began=$SECONDS
    $line 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    log "[$name] exit ${rc}$([ "$rc" = 124 ] && echo ' (stopped at its cap)') after $((SECONDS - began)) s"
done
log "gpu_session: $((SECONDS - start)) s of ${budget_s} used"

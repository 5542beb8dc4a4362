#!/usr/bin/env python3
"""GPT-2 training with steps of varying shape, then generation, under PyTorch's default caching
allocator, its expandable segments and expanse (the native allocator), one process each: peak
reserved memory and median training step time side by side, and whether expanse is at or below
expandable segments on both.

    EXPANSE_CONF=driver:cuda EXPANSE_LIBRARY=build/lib/libexpanse.so \\
        python3 test/gpu/gpt2_check.py [--out gpt2.json]     (test/gpu/run_on_gpu.sh: gpt2)

The workload: Hugging Face GPT2LMHeadModel built from GPT2Config() (12 layers, width 768, 1024
positions, random weights after torch.manual_seed(0)), AdamW at lr 3e-4. random.Random(seed)
draws, for each training step, a length L in 64..1024 and a batch b in 2..12; the step trains on
b random token sequences of length L (labels = inputs). Then generate() call i (greedy, KV cache)
continues 2 b_i prompts of 32 random tokens (b_i: training step i's batch) by exactly 32 + 8 i
tokens. Token values come from a CPU torch.Generator seeded the same, so every process trains
on the same data. (The H200 run of b12ef1a drew its shapes from another generator, so its
absolute figures are not this script's: the criteria compare allocators within one run.)

Each child (--allocator NAME) prints one JSON line: peak reserved and allocated bytes
(torch.cuda.max_memory_reserved / max_memory_allocated over the whole run), the median step time
(CUDA-synchronized wall time of forward, backward and optimizer step; the first --warmup steps
left out), every step's loss, and times; expanse's adds its driver call counts (and the
cuMemCreate + cuMemRelease calls from step 10 on: churn once the shapes are known). The parent (no --allocator) runs the three children,
prints the table and exits 1 when:
  - a child fails (crash, timeout, no result), or expanse is not the native allocator;
  - expanse's median step exceeds 1.03 x expandable segments';
  - expanse's peak reserved exceeds expandable segments' + 64 MiB;
  - the loss trajectories differ between allocators (relative tolerance --loss-rtol: an
    allocator must not change what the model computes).
Exit 77 when no child found a GPU. --expanse-conf runs expanse in another configuration (e.g.
driver:cuda,thread_cache:0).

--cpu runs the same code on the CPU with a 2-layer model of 1,024 tokens, to check this script
on a machine without a GPU: no allocator is set up, memory figures are 0, and only the loss
criterion is judged.
"""
import argparse
import hashlib
import json
import os
import pathlib
import random
import signal
import statistics
import subprocess
import sys
import time

T_START = time.perf_counter()
REPO = pathlib.Path(__file__).resolve().parents[2]
ALLOCATORS = ("default", "expandable", "expanse")
SKIP = 77
MiB = 1 << 20
GiB = 1 << 30
# expanse's bounds against expandable segments.
TIME_RATIO = 1.03
MEMORY_SLACK = 64 * MiB
# Driver calls that change physical memory (counted after the workload has shown its shapes).
CHURN_CALLS = ("cuMemCreate", "cuMemRelease")
# What the expanse child reports of expanse's driver calls.
REPORTED_CALLS = ("cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemSetAccess",
                  "cuEventRecord", "cuCtxGetCurrent", "cuCtxPushCurrent", "cuCtxPopCurrent")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---- child: one allocator, one process ---------------------------------------------------------

def install_expanse(torch):
    """Makes expanse PyTorch's native allocator, or exits naming why not: a fallback to the
    pluggable pair would measure something else (and max_memory_allocated() raises there)."""
    sys.path.insert(0, str(REPO / "python"))
    # A CUDA application is never to be handed the sim's host memory.
    os.environ.setdefault("EXPANSE_CONF", "driver:cuda")
    import logging
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # Which CUDA headers the native build chose (and why others were refused) goes to the log.
    logging.getLogger("expanse.torch").setLevel(logging.INFO)
    import expanse
    import expanse.torch
    t0 = time.perf_counter()
    try:
        alloc = expanse.torch.use(native=True)
    except Exception as e:  # noqa: BLE001  (NativeUnavailable, a failed install, ...)
        raise SystemExit(f"gpt2_check: expanse's native allocator could not be installed: "
                         f"{type(e).__name__}: {e}")
    if not expanse.torch.native_in_use():
        raise SystemExit(f"gpt2_check: expanse.torch.use(native=True) returned {alloc!r}, "
                         "not the native allocator")
    before = expanse.memory_stats()["allocation.all.allocated"]
    probe = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    after = expanse.memory_stats()["allocation.all.allocated"]
    del probe
    if after != before + 1:
        raise SystemExit(f"gpt2_check: a CUDA tensor did not come from expanse (expanse "
                         f"allocations {before} -> {after})")
    torch.cuda.max_memory_allocated()  # raises under the pluggable pair
    log(f"gpt2_check: {alloc} installed in {time.perf_counter() - t0:.1f} s; "
        f"{expanse.driver_description()}; EXPANSE_CONF={os.environ.get('EXPANSE_CONF', '')}")
    return expanse


def expandable_setting(torch):
    """PyTorch's own answer to whether its allocator uses expandable segments (None: not said
    by this PyTorch)."""
    try:
        return torch.cuda.memory._snapshot().get("allocator_settings", {}).get(
            "expandable_segments")
    except Exception:  # noqa: BLE001
        return None


def driver_calls(expanse):
    s = expanse.memory_stats()
    return {name: s.get("expanse.driver_calls." + name, 0) for name in REPORTED_CALLS}


def run_child(args):
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed", file=sys.stderr)
        return SKIP
    device = "cpu" if args.cpu else "cuda"
    if not args.cpu and not torch.cuda.is_available():
        print("SKIP: no CUDA GPU for PyTorch", file=sys.stderr)
        return SKIP
    expanse = None
    if args.allocator == "expanse" and not args.cpu:
        expanse = install_expanse(torch)  # before transformers can touch CUDA
    from transformers import GPT2Config, GPT2LMHeadModel
    import transformers

    def sync():
        if not args.cpu:
            torch.cuda.synchronize()

    torch.manual_seed(0)
    config = (GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1024, bos_token_id=1023,
                         eos_token_id=1023) if args.cpu else GPT2Config())
    model = GPT2LMHeadModel(config).to(device)
    model.train()
    if not args.cpu and args.allocator != "expanse":
        want = args.allocator == "expandable"
        got = expandable_setting(torch)
        if got is None:
            log("gpt2_check: this PyTorch does not say whether expandable segments are on")
        elif got != want:
            raise SystemExit(f"gpt2_check: {args.allocator}: PyTorch's expandable_segments is "
                             f"{got}, expected {want} (PYTORCH_CUDA_ALLOC_CONF="
                             f"{os.environ.get('PYTORCH_CUDA_ALLOC_CONF')!r})")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    shapes = random.Random(args.seed)
    tokens = torch.Generator().manual_seed(args.seed)
    vocab = config.vocab_size
    batches, losses, step_s = [], [], []
    churn_from = min(10, args.steps)  # where the workload has shown most of its shapes
    calls_at = None
    sync()
    t_setup = time.perf_counter() - T_START
    t_train = time.perf_counter()
    for i in range(args.steps):
        length, batch = shapes.randint(64, 1024), shapes.randint(2, 12)
        batches.append(batch)
        x = torch.randint(0, vocab, (batch, length), generator=tokens).to(device)
        if expanse is not None and i == churn_from:
            calls_at = driver_calls(expanse)
        sync()
        t0 = time.perf_counter()
        # The output (and its logits) dies here: only the loss lives past the forward pass.
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        step_s.append(time.perf_counter() - t0)
        losses.append(loss.item())
        del x, loss
    train_s = time.perf_counter() - t_train
    peak_reserved_train = 0 if args.cpu else torch.cuda.max_memory_reserved()
    calls_train = driver_calls(expanse) if expanse is not None else None

    model.eval()
    generated = hashlib.sha1()
    t_gen = time.perf_counter()
    for i in range(args.generate):
        # 2 b_i prompts, b_i the batch of training step i: what the recording of this workload
        # on the H200 shows (its generate() batches were twice its first steps' batches).
        prompts = torch.randint(0, vocab, (2 * batches[i % len(batches)], 32),
                                generator=tokens).to(device)
        new = 32 + 8 * i
        # min_new_tokens: an end-of-text token drawn by the random weights does not cut a call
        # short, so every process generates the same number of tokens.
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts),
                             max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=config.eos_token_id)
        if out.shape != (prompts.shape[0], 32 + new):
            raise SystemExit(f"gpt2_check: generate() call {i} returned shape "
                             f"{tuple(out.shape)}, expected {(prompts.shape[0], 32 + new)}")
        generated.update(str(out.tolist()).encode())
        del out, prompts
    sync()
    generate_s = time.perf_counter() - t_gen

    timed = step_s[args.warmup:]
    result = {
        "allocator": args.allocator,
        "peak_reserved_bytes": 0 if args.cpu else torch.cuda.max_memory_reserved(),
        "peak_allocated_bytes": 0 if args.cpu else torch.cuda.max_memory_allocated(),
        "peak_reserved_train_bytes": peak_reserved_train,
        "step_median_ms": statistics.median(timed) * 1e3,
        "step_min_ms": min(timed) * 1e3,
        "step_max_ms": max(timed) * 1e3,
        "last_loss": losses[-1],
        "losses": losses,
        "generated_sha1": generated.hexdigest(),
        "setup_s": t_setup,
        "train_s": train_s,
        "generate_s": generate_s,
        "total_s": time.perf_counter() - T_START,
        "steps": args.steps,
        "generate_calls": args.generate,
        "seed": args.seed,
        "device": "cpu" if args.cpu else torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if expanse is not None:
        end = driver_calls(expanse)
        stats = expanse.memory_stats()
        result["expanse"] = {
            "conf": os.environ.get("EXPANSE_CONF", ""),
            "driver_calls": end,
            "driver_calls_training": calls_train,
            f"churn_calls_from_step_{churn_from}": (
                sum(calls_train[c] - calls_at[c] for c in CHURN_CALLS) if calls_at else None),
            "created_pages": stats.get("expanse.num_created_pages"),
            "released_pages": stats.get("expanse.num_released_pages"),
            "reclaimed_pages": stats.get("expanse.num_reclaimed_pages"),
            "allocations": stats.get("allocation.all.allocated"),
        }
    print(json.dumps(result), flush=True)
    return 0


# ---- parent: the three children, side by side ----------------------------------------------------

def child_env(allocator, args):
    env = dict(os.environ)
    # PyTorch reads PYTORCH_ALLOC_CONF first, then PYTORCH_CUDA_ALLOC_CONF: neither may carry a
    # setting of the caller's into the comparison.
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        env.pop(name, None)
    if allocator == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if allocator == "expanse":
        if args.library:
            env["EXPANSE_LIBRARY"] = args.library
        if args.expanse_conf is not None:
            env["EXPANSE_CONF"] = args.expanse_conf
    return env


def describe_exit(code):
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def run_one(allocator, args):
    """(result dict, None) or (None, why it failed); SKIP as the reason when the child found no
    GPU."""
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--allocator", allocator,
           "--steps", str(args.steps), "--generate", str(args.generate), "--seed",
           str(args.seed), "--warmup", str(args.warmup)] + (["--cpu"] if args.cpu else [])
    log(f"==== gpt2_check: {allocator}")
    t0 = time.perf_counter()
    try:
        # stderr goes straight to ours (the log); stdout carries the result line.
        p = subprocess.run(cmd, env=child_env(allocator, args), stdout=subprocess.PIPE,
                           text=True, timeout=args.child_timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        if out:
            log(out.rstrip())
        return None, f"timed out after {args.child_timeout} s"
    result = None
    for line in p.stdout.splitlines():
        try:
            parsed = json.loads(line)
        except ValueError:
            log(line)
            continue
        if isinstance(parsed, dict) and parsed.get("allocator") == allocator:
            result = parsed
    log(f"==== gpt2_check: {allocator}: {describe_exit(p.returncode)} after "
        f"{time.perf_counter() - t0:.1f} s")
    if p.returncode == SKIP:
        return None, SKIP
    if p.returncode != 0:
        return None, describe_exit(p.returncode) + " (its stderr is in the log above)"
    if result is None:
        return None, "exited 0 without a result line"
    return result, None


def losses_differ(a, b, rtol):
    """The first step whose losses differ beyond rtol, as (step, loss a, loss b), or None."""
    if len(a) != len(b):
        return (min(len(a), len(b)), f"{len(a)} steps", f"{len(b)} steps")
    for i, (x, y) in enumerate(zip(a, b)):
        # NaN fails too: it is never within the tolerance.
        if not abs(x - y) <= rtol * max(abs(x), abs(y)):
            return (i, x, y)
    return None


def judge(results, errors, args):
    """The failed criteria, one line each."""
    failed = [f"{name}: {why}" for name, why in errors.items()]
    ok = {name: r for name, r in results.items() if r is not None}
    names = [n for n in ALLOCATORS if n in ok]
    for other in names[1:]:
        diff = losses_differ(ok[names[0]]["losses"], ok[other]["losses"], args.loss_rtol)
        if diff is not None:
            failed.append(f"loss trajectories differ: {names[0]} and {other} at step {diff[0]} "
                          f"({diff[1]} vs {diff[2]}; relative tolerance {args.loss_rtol})")
    if args.cpu:
        return failed
    e, x = ok.get("expanse"), ok.get("expandable")
    if e is None or x is None:
        failed.append("expanse against expandable segments not judged: "
                      f"{'expanse' if e is None else 'expandable'} has no result")
        return failed
    if e["step_median_ms"] > TIME_RATIO * x["step_median_ms"]:
        failed.append(f"expanse's median step {e['step_median_ms']:.1f} ms > {TIME_RATIO} x "
                      f"expandable segments' {x['step_median_ms']:.1f} ms "
                      f"({e['step_median_ms'] / x['step_median_ms']:.3f} x)")
    if e["peak_reserved_bytes"] > x["peak_reserved_bytes"] + MEMORY_SLACK:
        failed.append(f"expanse's peak reserved {e['peak_reserved_bytes'] / GiB:.2f} GiB > "
                      f"expandable segments' {x['peak_reserved_bytes'] / GiB:.2f} GiB + 64 MiB "
                      f"(+{(e['peak_reserved_bytes'] - x['peak_reserved_bytes']) / MiB:.0f} MiB)")
    return failed


def table(results, errors):
    rows = [f"{'allocator':<12}{'peak reserved':>15}{'peak allocated':>16}{'step median':>13}"
            f"{'step min-max':>16}{'last loss':>11}{'total':>9}"]
    for name in ALLOCATORS:
        r = results.get(name)
        if r is None:
            why = errors.get(name, "not run")
            rows.append(f"{name:<12}  FAILED: {why}")
            continue
        rows.append(f"{name:<12}{r['peak_reserved_bytes'] / GiB:>11.2f} GiB"
                    f"{r['peak_allocated_bytes'] / GiB:>12.2f} GiB"
                    f"{r['step_median_ms']:>10.1f} ms"
                    f"{r['step_min_ms']:>7.1f}-{r['step_max_ms']:.1f} ms"
                    f"{r['last_loss']:>11.4f}{r['total_s']:>7.1f} s")
    return "\n".join(rows)


def run_parent(args):
    results, errors = {}, {}
    for name in ALLOCATORS:
        result, why = run_one(name, args)
        results[name] = result
        if why is not None:
            errors[name] = why
    if len(errors) == len(ALLOCATORS) and all(why == SKIP for why in errors.values()):
        print("SKIP: no child found PyTorch with a GPU")
        return SKIP
    errors = {n: ("skipped: no GPU" if why == SKIP else why) for n, why in errors.items()}
    first = next((r for r in results.values() if r), None)
    if first:
        print(f"GPT-2 on {first['device']} (torch {first['torch']}, transformers "
              f"{first['transformers']}): {args.steps} training steps (median of steps "
              f"{args.warmup}-{args.steps - 1}), {args.generate} generate() calls, seed "
              f"{args.seed}")
    print(table(results, errors))
    e = results.get("expanse")
    if e and "expanse" in e:
        print("expanse:", json.dumps(e["expanse"]))
    ok = [r for r in results.values() if r]
    if len(ok) > 1:
        worst = max(abs(x - y) / max(abs(x), abs(y), 1e-30)
                    for r in ok[1:] for x, y in zip(ok[0]["losses"], r["losses"]))
        print("losses: " + ("bit-identical across allocators" if worst == 0 else
                            f"largest relative difference from {ok[0]['allocator']}: {worst:.2e}"))
    sums = {n: r["generated_sha1"][:12] for n, r in results.items() if r}
    if len(set(sums.values())) > 1:
        # Greedy decoding of random weights can flip on a near tie; reported, not judged.
        print(f"note: the generated tokens differ between allocators: {sums}")
    failed = judge(results, errors, args)
    for line in failed:
        print("FAIL:", line)
    if args.cpu:
        print("(--cpu: memory and time criteria not judged)")
    print("PASS" if not failed else f"FAIL: {len(failed)} criterion/criteria not met")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"results": results, "errors": errors, "failed": failed,
                       "criteria": {"time_ratio": TIME_RATIO, "memory_slack_bytes": MEMORY_SLACK,
                                    "loss_rtol": args.loss_rtol}}, f, indent=1)
    return 1 if failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--allocator", choices=ALLOCATORS,
                   help="run the workload under this allocator only and print its JSON line")
    p.add_argument("--all", action="store_true",
                   help="run every allocator in its own process and compare (the default)")
    p.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    p.add_argument("--generate", type=int, default=10, help="generate() calls (default 10)")
    p.add_argument("--seed", type=int, default=1, help="shape and token seed (default 1)")
    p.add_argument("--warmup", type=int, default=3,
                   help="first steps left out of the median (default 3)")
    p.add_argument("--library", help="libexpanse.so for the expanse child (default: "
                   "EXPANSE_LIBRARY, else where the expanse package finds it)")
    p.add_argument("--expanse-conf", help="EXPANSE_CONF for the expanse child (default: "
                   "EXPANSE_CONF, else driver:cuda)")
    p.add_argument("--child-timeout", type=int, default=150,
                   help="seconds each child may take (default 150)")
    # Random tokens keep the loss near ln(vocabulary) whatever happens, so only a tight bound
    # tells; the H200 run of b12ef1a found the trajectories identical.
    p.add_argument("--loss-rtol", type=float, default=1e-5,
                   help="relative tolerance between allocators' losses (default 1e-5)")
    p.add_argument("--out", help="write every result and the verdict to this JSON file")
    p.add_argument("--cpu", action="store_true",
                   help="check this script without a GPU (small model, no allocator set up)")
    args = p.parse_args()
    if args.allocator and args.all:
        p.error("--allocator runs one child; --all runs them all: not both")
    if args.steps <= args.warmup or args.warmup < 0:
        p.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup}) >= 0")
    if args.generate < 0 or args.child_timeout <= 0:
        p.error("--generate must be >= 0 and --child-timeout > 0")
    return run_child(args) if args.allocator else run_parent(args)


if __name__ == "__main__":
    sys.exit(main())

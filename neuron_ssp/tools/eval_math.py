"""dust-tt/llama2-ssp's quality check: a×b with a, b drawn from 1..99, scored on the first integer of the answer.

Plain sampling and speculative sampling answer the same problems with the same seeds; each gets a
95% interval (Wilson, Clopper-Pearson or Wald: `tools.proportions`), and a pooled two-proportion
z-test says whether their accuracies differ. (The
two runs answer the same problems, so the unpaired test is conservative; with greedy decoding the
answers are identical by construction.)
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from neuron_ssp.engines.native import plain_generate
from neuron_ssp.pipeline.pipeline import Pipeline
from neuron_ssp.tools.proportions import Proportion, ZTest, two_proportion_z_test

QUESTION = "What is {a} times {b}? Answer with the number only."
# "1,234" is one integer; a lone run of digits otherwise. A minus sign belongs to the number.
INTEGER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?!\d)|-?\d+")


@dataclass(frozen=True)
class MathProblem:
    a: int
    b: int

    @property
    def answer(self) -> int:
        return self.a * self.b

    @property
    def prompt(self) -> str:
        return QUESTION.format(a=self.a, b=self.b)


@dataclass(frozen=True)
class MathOutcome:
    problem: MathProblem
    plain_text: str
    ssp_text: str

    @property
    def plain_correct(self) -> bool:
        return first_integer(self.plain_text) == self.problem.answer

    @property
    def ssp_correct(self) -> bool:
        return first_integer(self.ssp_text) == self.problem.answer


@dataclass
class MathEval:
    outcomes: list[MathOutcome]

    @property
    def plain(self) -> Proportion:
        return Proportion(sum(o.plain_correct for o in self.outcomes), len(self.outcomes))

    @property
    def ssp(self) -> Proportion:
        return Proportion(sum(o.ssp_correct for o in self.outcomes), len(self.outcomes))

    @property
    def test(self) -> ZTest:
        return two_proportion_z_test(self.plain, self.ssp)


def make_problems(seed: int, count: int) -> list[MathProblem]:
    """The same seed gives the same problems on every machine (Python's Mersenne Twister)."""
    rng = random.Random(seed)
    return [MathProblem(rng.randint(1, 99), rng.randint(1, 99)) for _ in range(count)]


def first_integer(text: str) -> int | None:
    match = INTEGER.search(text)
    return int(match.group().replace(",", "")) if match else None


def run_math_eval(
    pipeline: Pipeline, problems: list[MathProblem], answer_tokens: int, on_step: Callable[[], None] | None = None
) -> MathEval:
    """Problem i is sampled with seed (sampling.seed + i), by plain decoding and by SSp alike."""
    base = pipeline.config.sampling
    generator = pipeline.generator
    outcomes = []
    for i, problem in enumerate(problems):
        sampling = base.model_copy(update={"seed": base.seed + i})
        ids = pipeline.encode(problem.prompt)
        plain = plain_generate(pipeline.target, ids, answer_tokens, sampling, pipeline.eos_token_ids)
        generator.sampling = sampling
        ssp = generator.generate(ids, answer_tokens, pipeline.eos_token_ids)
        decode = pipeline.tokenizer.decode
        outcomes.append(
            MathOutcome(
                problem, decode(plain.tokens, skip_special_tokens=True), decode(ssp.tokens, skip_special_tokens=True)
            )
        )
        if on_step:
            on_step()
    generator.sampling = base
    return MathEval(outcomes)

"""A tiny taskset written in verifiers v1's own API (imported only where verifiers is installed)."""

from __future__ import annotations

import verifiers.v1 as vf


class DigitData(vf.TaskData):
    answer: str


class DigitTask(vf.Task[DigitData]):
    """The digit task: the answer is (last digit + 1) mod 10."""

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply[:1] == self.data.answer else 0.0

    @vf.reward(weight=0.5)
    async def digit(self, trace: vf.Trace) -> float:
        """Format: the reply opens with a digit."""
        return 1.0 if trace.last_reply[:1].isdigit() else 0.0

    @vf.metric
    async def length(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class DigitConfig(vf.TasksetConfig):
    num_tasks: int = 16


class DigitTaskset(vf.Taskset[DigitTask, DigitConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            prompt = f"{(7 * i + 3) % 10}{(3 * i + 1) % 10}{i % 10}="
            yield DigitTask(
                DigitData(prompt=prompt, system_prompt="answer with one digit", answer=str((i + 1) % 10)),
                self.config.task,
            )


class ChatTaskset(vf.Taskset[DigitTask, DigitConfig]):
    """Prompts given as messages (a system message of their own)."""

    def load(self):
        messages = [vf.SystemMessage(content="be brief"), vf.UserMessage(content="12=")]
        yield DigitTask(DigitData(prompt=messages, answer="3"), self.config.task)


class Infinite(vf.Taskset[DigitTask, DigitConfig]):
    INFINITE = True

    def load(self):
        i = 0
        while True:
            yield DigitTask(DigitData(prompt=f"{i % 10}=", answer=str((i + 1) % 10)), self.config.task)
            i += 1


class NoPrompt(vf.Taskset[DigitTask, DigitConfig]):
    def load(self):
        yield DigitTask(DigitData(answer="1"), self.config.task)


class BrokenTask(DigitTask):
    @vf.reward
    async def broken(self, trace: vf.Trace) -> float:
        raise ZeroDivisionError("no")


class Broken(vf.Taskset[BrokenTask, DigitConfig]):
    def load(self):
        yield BrokenTask(DigitData(prompt="1=", answer="2"), self.config.task)

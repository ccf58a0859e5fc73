"""LineWalk-v0: a small custom Gymnasium environment that nitro trains (docs/custom-envs.md).

An agent stands somewhere on the segment [-1, 1] and a goal lies somewhere else on it. Each
step the agent moves left, stays or moves right by `step_size`; it earns +1 and the episode
ends when it comes within `tolerance` of the goal, and pays `step_penalty` for every other
step. Episodes are cut after 100 steps (the registration's max_episode_steps).

  observation  Box([-1, 1], shape (2,), float32): the agent's position, the goal's position
  action       Discrete(3): 0 left, 1 stay, 2 right

A random policy reaches the goal in about half of its episodes; a trained one walks straight
to it (return about 1 - 0.01 * distance / step_size, 0.9 and more). Importing this module
registers the id, so nitro names it "line_walk:LineWalk-v0" and imports the module on the
learner and on every actor, once `line_walk` is listed in NITRO_ENV_MODULES.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ENV_ID = "LineWalk-v0"


class LineWalkEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(self, step_size: float = 0.1, tolerance: float = 0.05, step_penalty: float = 0.01,
                 render_mode: str | None = None):
        if not 0.0 < step_size <= 1.0:
            raise ValueError(f"step_size must be in (0, 1], got {step_size}")
        if not 0.0 < tolerance < 1.0:
            raise ValueError(f"tolerance must be in (0, 1), got {tolerance}")
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.step_size, self.tolerance, self.step_penalty = float(step_size), float(tolerance), float(step_penalty)
        self.render_mode = render_mode
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(3)
        self.position = self.goal = 0.0

    def _obs(self) -> np.ndarray:
        return np.array([self.position, self.goal], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)  # seeds self.np_random: the same seed gives the same episode
        self.position, self.goal = (float(x) for x in self.np_random.uniform(-1.0, 1.0, size=2))
        while abs(self.position - self.goal) <= self.tolerance:  # never start on the goal
            self.goal = float(self.np_random.uniform(-1.0, 1.0))
        return self._obs(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action must be 0, 1 or 2, got {action!r}")
        self.position = float(np.clip(self.position + (int(action) - 1) * self.step_size, -1.0, 1.0))
        distance = abs(self.position - self.goal)
        reached = distance <= self.tolerance
        reward = 1.0 if reached else -self.step_penalty
        return self._obs(), reward, reached, False, {"distance": distance}

    def render(self) -> np.ndarray | None:
        """An rgb_array frame: the segment in grey, the goal in green, the agent in blue."""
        if self.render_mode != "rgb_array":
            return None
        frame = np.full((40, 220, 3), 255, dtype=np.uint8)
        frame[19:21, 10:210] = 160

        def column(x: float) -> int:
            return int(round(10 + (x + 1.0) * 100))

        g, a = column(self.goal), column(self.position)
        frame[12:28, max(g - 2, 0):g + 3] = (0, 160, 0)
        frame[15:25, max(a - 4, 0):a + 5] = (30, 60, 220)
        return frame


gym.register(ENV_ID, entry_point=LineWalkEnv, max_episode_steps=100)

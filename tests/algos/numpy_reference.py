"""Plain NumPy references, written as the papers' explicit sums (not the scan recursions)."""

from __future__ import annotations

import numpy as np


def episode_patterns(rng: np.random.Generator, T: int, B: int, p_done: float = 0.2):
    """terminated, truncated, valid [T, B] following next-step autoreset.

    After a done step comes one invalid autoreset step. Column 0 terminates and column 1
    truncates at the last step; some columns start with an invalid step (their previous
    rollout ended on its last step).
    """
    terminated = np.zeros((T, B), bool)
    truncated = np.zeros((T, B), bool)
    valid = np.ones((T, B), bool)
    for b in range(B):
        prev_done = rng.random() < 0.3
        for t in range(T):
            if prev_done:
                valid[t, b] = False
                prev_done = False
            elif b < 2 and t >= T - 2:  # column 0 terminates, column 1 truncates at T-1
                if t == T - 1:
                    (terminated if b == 0 else truncated)[t, b] = True
            elif rng.random() < p_done:
                (terminated if rng.random() < 0.5 else truncated)[t, b] = True
                prev_done = True
    return terminated, truncated, valid


def _next_values(values, last_value):
    return np.concatenate([values[1:], last_value[None]], axis=0)


def gae(rewards, values, last_value, terminated, truncated, valid, gamma, lam):
    """A_s = sum_{t=s}^{end of episode or rollout} (gamma lam)^{t-s} delta_t."""
    T, B = rewards.shape
    next_values = _next_values(values, last_value)
    delta = rewards + gamma * next_values * (1.0 - terminated) - values
    done = terminated | truncated
    adv = np.zeros((T, B), np.float64)
    for b in range(B):
        for s in range(T):
            if not valid[s, b]:
                continue
            coef = 1.0
            for t in range(s, T):
                adv[s, b] += coef * delta[t, b]
                if done[t, b]:
                    break
                coef *= gamma * lam
    return adv, np.where(valid, adv + values, values)


def vtrace(
    behaviour_logprobs,
    target_logprobs,
    rewards,
    values,
    last_value,
    terminated,
    truncated,
    valid,
    gamma,
    lam,
    rho_bar,
    c_bar,
):
    """Espeholt et al. (2018), eq. (1):
    v_s = V(x_s) + sum_t gamma^{t-s} (prod_{i<t} c_i) delta_t V."""
    T, B = rewards.shape
    ratio = np.exp(target_logprobs - behaviour_logprobs)
    rho = np.minimum(rho_bar, ratio)
    c = lam * np.minimum(c_bar, ratio)
    next_values = _next_values(values, last_value)
    delta = rho * (rewards + gamma * (1.0 - terminated) * next_values - values)
    done = terminated | truncated
    vs = values.astype(np.float64).copy()
    for b in range(B):
        for s in range(T):
            if not valid[s, b]:
                continue
            discount = 1.0
            for t in range(s, T):
                vs[s, b] += discount * delta[t, b]
                if done[t, b]:
                    break
                discount *= gamma * c[t, b]
    pg = np.zeros((T, B), np.float64)
    for b in range(B):
        for s in range(T):
            if not valid[s, b]:
                continue
            if s == T - 1:
                nxt = last_value[b]
            elif done[s, b]:
                nxt = values[s + 1, b]  # V(final obs): the truncation bootstrap
            else:
                nxt = vs[s + 1, b]
            pg[s, b] = rho[s, b] * (
                rewards[s, b] + gamma * (1.0 - terminated[s, b]) * nxt - values[s, b]
            )
    return vs, pg


def masked_mean(x, valid):
    return float(np.sum(np.where(valid, x, 0.0)) / max(np.sum(valid), 1))


def clip_by_global_norm(grads: list[np.ndarray], max_norm: float) -> list[np.ndarray]:
    """optax.clip_by_global_norm (as Cleanba uses it): scale all by min(1, max_norm / norm)."""
    norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
    scale = min(1.0, max_norm / norm)
    return [g * scale for g in grads]


def rmsprop(params, grad_sequence, learning_rates, decay, eps, max_norm, style):
    """Clip then RMSProp (momentum 0), one step per gradient list, in float64.

    torch: PyTorch's torch.optim.RMSprop: square_avg starts at 0,
        square_avg = alpha * square_avg + (1 - alpha) g^2;  p -= lr * g / (sqrt(square_avg) + eps).
    tf: TF1's tf.train.RMSPropOptimizer: ms starts at 1,
        ms = rho * ms + (1 - rho) g^2;  p -= lr * g / sqrt(ms + eps).
    """
    params = [np.asarray(p, np.float64) for p in params]
    ms = [np.full_like(p, 0.0 if style == "torch" else 1.0) for p in params]
    for grads, lr in zip(grad_sequence, learning_rates):
        grads = clip_by_global_norm([np.asarray(g, np.float64) for g in grads], max_norm)
        for i, g in enumerate(grads):
            ms[i] = decay * ms[i] + (1 - decay) * g**2
            denom = np.sqrt(ms[i]) + eps if style == "torch" else np.sqrt(ms[i] + eps)
            params[i] = params[i] - lr * g / denom
    return params

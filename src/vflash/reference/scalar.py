"""Online softmax in pure Python, one score at a time (the lesson's demo).

No tensors: the point is that streaming keys in blocks of any size and
rescaling by exp(m_old - m_new) gives the same output as the one-shot softmax,
to machine precision.
"""

import math
from typing import List, Sequence

Vector = Sequence[float]


def full_attention(q: Vector, keys: Sequence[Vector], values: Sequence[Vector]) -> List[float]:
    """Materialise every score, softmax the row, weight the values."""
    d = len(q)
    scores = [sum(qi * ki for qi, ki in zip(q, k)) / math.sqrt(d) for k in keys]
    m = max(scores)
    exps = [math.exp(s - m) for s in scores]
    z = sum(exps)
    dv = len(values[0])
    return [sum(e / z * values[i][j] for i, e in enumerate(exps)) for j in range(dv)]


def online_attention(q: Vector, keys: Sequence[Vector], values: Sequence[Vector],
                     block: int = 2) -> List[float]:
    """Stream keys/values in blocks; keep running max m, sum l and accumulator."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    d = len(q)
    dv = len(values[0])
    m, l, acc = -math.inf, 0.0, [0.0] * dv
    for start in range(0, len(keys), block):
        for k, v in zip(keys[start:start + block], values[start:start + block]):
            s = sum(qi * ki for qi, ki in zip(q, k)) / math.sqrt(d)
            m_new = max(m, s)
            corr = math.exp(m - m_new) if m != -math.inf else 0.0
            p = math.exp(s - m_new)
            l = l * corr + p
            acc = [a * corr + p * vj for a, vj in zip(acc, v)]
            m = m_new
    return [a / l for a in acc]


# The lesson's fixed example.
DEMO_Q = [0.5, -0.3, 0.8, 0.1]
DEMO_K = [[0.2, 0.1, -0.4, 0.6], [0.9, -0.2, 0.3, 0.0], [-0.5, 0.4, 0.7, -0.1],
          [0.1, 0.1, 0.1, 0.1], [0.8, 0.8, -0.8, 0.2], [-0.3, 0.5, 0.2, 0.9]]
DEMO_V = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0],
          [0.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0]]

"""The angle of a rotation, exact at every size: one formula for every rotation error the comparison reports.

arccos((tr(R) - 1) / 2) loses small angles: near the identity the trace moves by theta^2 / 2, so a
0.005 degree error (7.6e-9 on the trace) drowns in the round-off of float32 poses (6e-8 a matrix
entry) and reads as exactly 0 (issue 54 measured 76 of 80 frames at 0 for a true 0.005 degree each).
Instead the matrix becomes a unit quaternion (w, v) in float64 (scipy's `Rotation.from_matrix`, which
also projects a matrix that round-off left slightly off SO(3) onto the nearest rotation) and the angle
is 2 atan2(|v|, |w|): |v| = sin(theta / 2) is first-order in theta, so 0.001 degree is measured as such,
and atan2 stays exact up to 180 degrees. That is `Rotation.magnitude()`.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation


def rotation_angle_deg(rotation: np.ndarray) -> np.ndarray:
    """The angles of rotation matrices [..., 3, 3], in degrees, in [0, 180]."""
    matrices = np.asarray(rotation, np.float64)
    batch = matrices.shape[:-2]
    angles = Rotation.from_matrix(matrices.reshape(-1, 3, 3)).magnitude()
    return np.degrees(angles).reshape(batch)

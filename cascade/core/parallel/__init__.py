"""The processes of a tensor-parallel target: rank 0 schedules, the follower ranks replay."""

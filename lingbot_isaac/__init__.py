"""lingbot_isaac: the Isaac Sim side. Records robot camera trajectories as LingBot-World episodes.

Never imports torch. Kit/omni imports stay in `extension.py` (and the small adapter it uses).
"""

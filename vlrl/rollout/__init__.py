"""vlrl.rollout"""

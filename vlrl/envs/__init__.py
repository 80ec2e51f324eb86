"""vlrl.envs"""

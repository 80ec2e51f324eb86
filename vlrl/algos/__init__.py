"""vlrl.algos"""

"""vlrl.checks"""

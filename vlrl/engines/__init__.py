"""vlrl.engines"""

"""vlrl.report"""

"""vlrl.render"""

"""Application: optimize and crawl pipelines, jobs, HTTP API, web dashboard."""

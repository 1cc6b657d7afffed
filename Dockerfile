# The same stack as requirements.txt on the official Airflow 3 image, plus the JDK that Spark (RayDP) needs.
# Build: docker build -t emr-ray-airflow .   (not buildable on the dev machines here: no Docker engine)
FROM apache/airflow:3.3.2-python3.11

USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    # the HDFS provider's Kerberos extra (gssapi, krb5) builds from source against these
    libkrb5-dev gcc \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    PYTHONPATH=/opt/airflow/project

USER airflow
WORKDIR /opt/airflow/project
COPY --chown=airflow:root requirements.txt constraints.txt pyproject.toml README.md ./
# torch first, from the CPU index (the default index would pull the multi-GB CUDA build)
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install --no-cache-dir -c constraints.txt -r requirements.txt
# Only the provider, the DAGs and include/: the local stack (devstack/), tests/, bench/ and scripts/ stay out.
COPY --chown=airflow:root plugins/ plugins/
COPY --chown=airflow:root dags/ dags/
COPY --chown=airflow:root include/ include/
RUN pip install --no-cache-dir --no-deps -e .
ENV AIRFLOW__CORE__DAGS_FOLDER=/opt/airflow/project/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/airflow/project/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False

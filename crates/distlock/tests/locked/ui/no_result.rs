#[distlock::locked(locks = locks, name = "report")]
async fn report(locks: &distlock::Locks) {}

#[distlock::locked(locks = locks, name = "count")]
async fn count(locks: &distlock::Locks) -> u32 {
    1
}

fn main() {}
